"""Launch real jobs for the tests (torchrun, or one process per rank) and scrape their endpoints.

Every test that starts ranks does it here: :class:`Job` (torchrun), :class:`Ranks` (one process
per rank, as srun does) and :class:`Process` (any one command, e.g. the demo CLI). Each starts
in a session of its own with SIGINT at its default action, captures its output by line, and is
stopped with :func:`exporter.tools.reaper.stop_tree`, also when the test fails.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import inspect
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import exporter.tools.top as top
from exporter.errors import ErrorCounter
from exporter.export.collector import DDPCollector, RankSources
from exporter.mixin.config import FAST
from exporter.sources.flight import InFlight
from exporter.sources.recorder import Recorder
from exporter.sources.walltime import JobClock
from exporter.tools.demo import metrics_urls
from exporter.tools.localstack import free_port
from exporter.tools.reaper import stop_tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = TypeVar("T")


class HandClock:
    """A clock the test moves by hand (``clock.t += 1.0``)."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def wait_for(cond: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll ``cond`` until it returns a truthy value; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what} (last error: {last_exc!r})"
    )


def scrape_text(url: str, timeout: float = 5.0) -> str:
    """GET a metrics endpoint."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def parse(text: str) -> dict[str, list]:
    """Parse exposition text into ``{sample name: [(labels, value), ...]}``."""
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def collected(recorder: Recorder, errors: ErrorCounter, **parts: object) -> str:
    """Return what one rank's collector renders, without a server (run ``r``, rank 0).

    In-flight state from the recorder's bookkeeping; ``parts``: more of its
    :class:`~exporter.export.collector.RankSources` (``goodput=``, ``settle=``).
    """
    src = RankSources(
        run="r",
        rank=0,
        errors=errors,
        info=dict,
        recorder=recorder,
        inflight=InFlight(recorder, errors, flight_recorder=False),
        job_clock=JobClock(),
        **parts,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DDPCollector(src))
    return generate_latest(registry).decode()


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    """Return the single sample value of ``name`` matching ``labels``."""
    hits = [
        v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    ]
    if len(hits) != 1:
        raise KeyError(f"{name}{labels}: {len(hits)} samples")
    return hits[0]


@contextlib.contextmanager
def default_signals() -> Iterator[None]:
    """Let processes started inside see SIGINT with its default action.

    A test session started from a non-interactive background shell (``nohup``, many CI runners)
    inherits SIGINT as ignored, and exec passes an ignored signal on to every child: a test that
    interrupts a child with SIGINT would wait in vain. Only an ignored disposition is inherited
    (a handler is reset by exec), so it is switched to the default around the spawn only.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGINT)
    if old is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        if old is signal.SIG_IGN:
            signal.signal(signal.SIGINT, old)


@functools.cache
def _child_tmp() -> str:
    """Return this test process's folder for its children's temporary files (removed at exit).

    torchrun's agent leaves a ``torchelastic_*`` folder in the temporary directory at every
    start; pointed here, the suite leaves none in ``/tmp``.
    """
    folder = tempfile.mkdtemp(prefix="ddp-exporter-test-children-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Return the environment of a process a test starts: this checkout first on the path."""
    full = dict(os.environ)
    full["PYTHONPATH"] = REPO + os.pathsep + full.get("PYTHONPATH", "")
    full["PYTHONUNBUFFERED"] = "1"
    full["TMPDIR"] = _child_tmp()
    full.update(env or {})
    return full


class Process:
    """One process a test starts: its own session, default signals, output captured by line.

    :meth:`stop` stops it and everything below it (torchrun's workers too, also stopped ones)
    through :func:`exporter.tools.reaper.stop_tree`; so does leaving a ``with`` block.
    """

    def __init__(self, cmd: list[str], env: dict[str, str], name: str = "") -> None:
        self.name = name
        with default_signals():
            self.proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                start_new_session=True,
                cwd=REPO,
            )
        self.pid = self.proc.pid
        #: Every line printed so far, with the monotonic time it was read.
        self.stamped: list[tuple[float, str]] = []
        self.urls: dict[int, str] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stamped.append((time.monotonic(), line))
            self.urls.update(metrics_urls(line))

    @property
    def lines(self) -> list[str]:
        """Return every line printed so far."""
        return [line for _, line in self.stamped]

    def text(self) -> str:
        """Return everything printed so far."""
        return "".join(self.lines)

    def seen(self, text: str) -> float | None:
        """Return when the first line containing ``text`` was read, None if none has been."""
        return next((t for t, line in self.stamped if text in line), None)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit and its output to be read; return its exit status."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)  # the pipe ends when the last writer is gone
        return code

    def poll(self) -> int | None:
        """Return the exit status, or None while it runs."""
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process itself."""
        self.proc.send_signal(sig)

    def stop(self) -> None:
        """Stop the process and every process below it; collect its output to the end."""
        stop_tree(self.proc)
        self._reader.join(timeout=10)

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Job(Process):
    """A torchrun job in its own session; torchrun and all its workers are stopped at the end."""

    def __init__(
        self,
        nproc: int,
        args: list[str],
        env: dict[str, str] | None = None,
        module: str = "exporter.tools.trainer",
        torchrun: list[str] | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        """``wrap`` turns the command into the one to start (e.g. on a node of the lab)."""
        self.nproc = nproc
        extra = list(torchrun or [])
        # The static rendezvous by default; a test may choose another (e.g. c10d for restarts,
        # --standalone, or a static one of several nodes).
        chosen = {"--rdzv-backend", "--standalone", "--master-addr"} & set(extra)
        rendezvous = (
            [] if chosen else ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
        )
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            *rendezvous,
            *extra,
        ]
        cmd += ["-m", module] if not module.endswith(".py") else [module]
        cmd += args
        super().__init__(wrap(cmd) if wrap else cmd, child_env(env), name="torchrun")

    def wait_urls(self, timeout: float = 180.0) -> dict[int, str]:
        """Wait until every rank printed its metrics URL (torch imports are slow under load)."""
        try:
            wait_for(
                lambda: len(self.urls) == self.nproc or self.proc.poll() is not None,
                timeout,
                "all ranks to print their metrics URL",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- job output ---\n{self.output()}") from None
        assert len(self.urls) == self.nproc, self.output()
        return dict(self.urls)

    def scrape(self, rank: int) -> dict[str, list]:
        """Scrape and parse one rank."""
        return parse(scrape_text(self.urls[rank]))

    def output(self) -> str:
        """Return the last lines the job printed."""
        return "".join(self.lines[-80:])

    def kill(self) -> None:
        """Stop torchrun and every worker it started (also stopped ones)."""
        self.stop()


#: Launcher variables a one-process-per-rank job must not inherit from the test's environment.
_LAUNCHER_VARS = ("TORCHELASTIC_", "SLURM_", "DDP_EXPORTER_RUN")


class Ranks:
    """One process per rank, as srun or mpirun start them (env:// rendezvous, no torchrun).

    ``cmd`` is the command of every rank (after ``python``), or a function of the rank giving
    it. Each rank gets RANK, LOCAL_RANK (the rank: one node), WORLD_SIZE, LOCAL_WORLD_SIZE and a
    shared MASTER_ADDR/MASTER_PORT, plus ``env`` and its entry in ``per_rank``. ``ranks``
    starts only some of them (the others are "missing"). Every rank is stopped at the end.
    """

    def __init__(
        self,
        world: int,
        cmd: list[str] | Callable[[int], list[str]],
        *,
        env: dict[str, str] | None = None,
        per_rank: dict[int, dict[str, str]] | None = None,
        ranks: list[int] | None = None,
    ) -> None:
        self.world = world
        self.master_port = free_port()
        self.started = time.monotonic()
        base = {k: v for k, v in child_env(env).items() if not k.startswith(_LAUNCHER_VARS)}
        base.update(env or {})
        self.procs: dict[int, Process] = {}
        try:
            for r in range(world) if ranks is None else ranks:
                rank_env = dict(
                    base,
                    RANK=str(r),
                    LOCAL_RANK=str(r),
                    WORLD_SIZE=str(world),
                    LOCAL_WORLD_SIZE=str(world),
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(self.master_port),
                )
                rank_env.update((per_rank or {}).get(r, {}))
                args = cmd(r) if callable(cmd) else cmd
                self.procs[r] = Process([sys.executable, *args], rank_env, name=f"rank {r}")
        except BaseException:
            self.stop()
            raise

    @property
    def urls(self) -> dict[int, str]:
        """Return every rank's metrics URL printed so far."""
        out: dict[int, str] = {}
        for p in self.procs.values():
            out.update(p.urls)
        return out

    def out(self, rank: int) -> str:
        """Return what ``rank`` printed so far."""
        return self.procs[rank].text()

    def output(self) -> str:
        """Return what every rank printed so far, rank by rank."""
        return "\n".join(f"--- rank {r}\n{p.text()}" for r, p in self.procs.items())

    def seen(self, text: str) -> float | None:
        """Return when any rank first printed a line containing ``text``."""
        times = [t for p in self.procs.values() if (t := p.seen(text)) is not None]
        return min(times, default=None)

    def wait(self, timeout: float) -> dict[int, int]:
        """Wait for every rank to exit; return the exit codes."""
        end = time.monotonic() + timeout
        codes = {}
        for r, p in self.procs.items():
            try:
                codes[r] = p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"rank {r} still running after {timeout}s\n{self.output()}"
                ) from None
        return codes

    def stop(self) -> None:
        """Stop every rank (a frozen one too)."""
        for p in self.procs.values():
            p.stop()

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def verdict_folder(dump_dir: str, episode: int = 1) -> str | None:
    """Return the folder of hang episode ``episode`` under ``dump_dir`` once the monitoring
    rank wrote its verdict (``verdict.txt``, after ``episode.json``), else None."""
    found = glob.glob(os.path.join(dump_dir, f"*-hang-{episode}", "verdict.txt"))
    return os.path.dirname(found[0]) if found else None


def verdict_culprits(text: str) -> list[str]:
    """Return the culprit lines of a hang verdict's text (between CULPRITS: and WAITING:)."""
    return text.split("CULPRITS:")[1].split("WAITING:")[0].strip().splitlines()


def trainer_stuck_at() -> str:
    """Return where the demo trainer's hang fault sits, as a verdict names it."""
    import exporter.tools.trainer as trainer

    lines, first = inspect.getsourcelines(trainer._load_batch_that_never_returns)
    line = first + next(i for i, text in enumerate(lines) if "time.sleep" in text)
    return f"trainer.py:{line} in _load_batch_that_never_returns"


def top_accuses(targets: list[str], rank: int, verdict: str) -> Callable[[], dict[int, str] | None]:
    """Return a check for :func:`wait_for` reading ``targets`` with ``top``, each read judged as
    top judges it: the accusations when ``rank`` alone is accused, its verdict starting with
    ``verdict``, else None."""
    history = top.ReadHistory()

    def check() -> dict[int, str] | None:
        rows = history.judge(top.fetch(targets))
        accused = {row.rank: row.verdict for row in rows if top.accuses(row)}
        return accused if list(accused) == [rank] and accused[rank].startswith(verdict) else None

    return check


class TopReader:
    """Read one run with ``top``'s own code, from the ranks' endpoints and from Prometheus."""

    MODES = ("targets", "prometheus")

    def __init__(self, targets: list[str], prometheus_url: str, run: str) -> None:
        self.targets, self.prometheus_url, self.run = targets, prometheus_url, run
        self.prev: dict[str, dict | None] = dict.fromkeys(self.MODES)
        self.history = top.ReadHistory()  # as top's, from the endpoints
        #: Every table read so far, per mode: ``{rank: verdict}``.
        self.tables: dict[str, list[dict[int, str]]] = {m: [] for m in self.MODES}

    def read(self) -> dict[str, dict[int, str]]:
        """Read both sources once (FAST rate window, as the drills' rules); return the tables."""
        out = {}
        for mode in self.MODES:
            if mode == "targets":
                rows = self.history.judge(top.fetch(self.targets))
            else:
                url, window = self.prometheus_url, FAST.rate_window
                if self.prev[mode] is None:  # as top's: a read one window back
                    self.prev[mode] = top.prometheus_baseline(url, self.run, window)
                rows = top.fetch_prometheus(url, self.run, window=window)
                rows = top.diagnose(rows, self.prev[mode])
            self.prev[mode] = {r.target: r for r in rows}
            out[mode] = {r.rank: r.verdict for r in rows}
            self.tables[mode].append(out[mode])
        return out
