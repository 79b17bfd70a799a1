"""Launch real torchrun jobs and scrape their endpoints, for the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

import exporter.tools.top as top
from exporter.mixin.config import FAST
from exporter.tools.demo import metrics_urls
from exporter.tools.localstack import free_port
from exporter.tools.reaper import stop_tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = TypeVar("T")


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


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    """Return the single sample value of ``name`` matching ``labels``."""
    hits = [
        v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    ]
    if len(hits) != 1:
        raise KeyError(f"{name}{labels}: {len(hits)} samples")
    return hits[0]


class Job:
    """A torchrun job in its own session; torchrun and all its workers are stopped at the end."""

    def __init__(
        self,
        nproc: int,
        args: list[str],
        env: dict[str, str] | None = None,
        module: str = "exporter.tools.trainer",
    ) -> None:
        self.nproc = nproc
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env.update(env or {})
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
        ]
        cmd += ["-m", module] if not module.endswith(".py") else [module]
        cmd += args
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=full_env,
            start_new_session=True,
            cwd=REPO,
        )
        self.lines: list[str] = []
        self.urls: dict[int, str] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self.urls.update(metrics_urls(line))

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
        """Return what the job printed so far."""
        return "".join(self.lines[-80:])

    def wait(self, timeout: float) -> int:
        """Wait for the job to exit."""
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """Stop torchrun and every worker it started (also stopped ones)."""
        stop_tree(self.proc)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


class TopReader:
    """Read one run with ``top``'s own code, from the ranks' endpoints and from Prometheus."""

    MODES = ("targets", "prometheus")

    def __init__(self, targets: list[str], prometheus_url: str, run: str) -> None:
        self.targets, self.prometheus_url, self.run = targets, prometheus_url, run
        self.prev: dict[str, dict | None] = dict.fromkeys(self.MODES)
        #: Every table read so far, per mode: ``{rank: verdict}``.
        self.tables: dict[str, list[dict[int, str]]] = {m: [] for m in self.MODES}

    def read(self) -> dict[str, dict[int, str]]:
        """Read both sources once (FAST rate window, as the drills' rules); return the tables."""
        out = {}
        for mode in self.MODES:
            if mode == "targets":
                rows = top.fetch(self.targets)
            else:
                rows = top.fetch_prometheus(self.prometheus_url, self.run, window=FAST.rate_window)
            rows = top.diagnose(rows, self.prev[mode])
            self.prev[mode] = {r.target: r for r in rows}
            out[mode] = {r.rank: r.verdict for r in rows}
            self.tables[mode].append(out[mode])
        return out
