"""Capture where every rank is stuck, automatically, seconds after a hang starts.

Everything goes through the c10d store, never through collectives (they are what hangs), and
runs on one background thread per rank, never on the training thread:

* every interval each rank ``set``s one small *report* key (per process group: last enqueued
  sequence number, oldest in-flight age, timeout; and its recent collective latency), and
  reads the run's *episode* counter with one ``add(key, 0)``;
* the monitoring rank reads every report with one ``multi_get`` per quarter interval (per
  interval beyond :data:`FAST_WATCH_MAX_RANKS` ranks), runs
  :func:`exporter.hung.find_hangs` (the one definition of "hung", shared with ``top`` and the
  alert rules) and, for a ``behind`` or ``symmetric`` finding, writes a request and bumps the
  episode counter: one episode per hang, a new one only after progress resumed;
* every rank that sees a new episode captures its state (the Python stack of every thread, the
  training thread first; the Flight Recorder's in-flight and recent collectives; step and
  phase), writes ``rank-N.json`` and ``rank-N.txt`` under ``dump_dir`` and sets its *ack* key
  with a short summary;
* the monitoring rank collects acks until every rank answered or a deadline passed, then logs
  the verdict (:mod:`exporter.hangs`) and writes it next to its dump. A rank that never
  answers (SIGSTOPped, dead, or a thread holding the GIL) is named as such.

Dump folders are 0o700 and files 0o600: stacks reveal internals and stay on the local disk.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import socket
import sys
import sysconfig
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from . import hangs
from .errors import ErrorCounter, log
from .hung import DEFAULT_POLICY, HangFinding, HangPolicy, SeqState, find_hangs

if TYPE_CHECKING:
    from .core import Observer

__all__ = [
    "DEFAULT_DUMP_DIR",
    "Forensics",
    "capture",
    "episode_dir",
    "innermost_user_frame",
    "summarize",
]

#: Where dumps go unless ``dump_dir=`` / ``DDP_EXPORTER_DUMP_DIR`` say otherwise (relative to
#: the working directory of each rank).
DEFAULT_DUMP_DIR = "ddp-exporter-dumps"

#: Frames kept per thread (innermost ones): deep recursion must not bloat a dump.
MAX_FRAMES = 100
#: Frames of the training thread carried in the ack through the store.
ACK_FRAMES = 40
#: Retired Flight Recorder entries kept per process group, besides every in-flight one.
RECENT_ENTRIES = 10
#: Largest job whose monitoring rank reads the reports every quarter interval, not every one.
FAST_WATCH_MAX_RANKS = 256
#: Seconds the C-level fallback (faulthandler) waits before it dumps every thread's stack.
FAULTHANDLER_S = 3.0

#: Frames under these folders are not "where the user's code is stuck": torch, the standard
#: library and installed packages (Lightning, transformers: their caller is the user's code).
_SKIP_DIRS = tuple(
    os.path.normpath(p) + os.sep
    for p in {
        os.path.dirname(torch.__file__),
        *(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
    if p
)
_EXPORTER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: The exporter's own modules are not the user's code, except the demo trainer, which is.
_USER_MODULES_HERE = ("demo.py",)


def _keys(run: str) -> dict[str, str]:
    base = f"ddp_exporter/{run}/fx"
    return {"episode": f"{base}/episode", "request": f"{base}/request", "base": base}


def _report_key(run: str, rank: int) -> str:
    return f"ddp_exporter/{run}/fx/report/{rank}"


def _ack_key(run: str, rank: int) -> str:
    return f"ddp_exporter/{run}/fx/ack/{rank}"


def episode_dir(dump_dir: str, run: str, episode: int) -> str:
    """Return the folder holding one episode's dumps (same name on every node)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run).strip("._") or "run"
    return os.path.join(dump_dir, f"{safe}-hang-{episode}")


def _makedirs_private(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o700, exist_ok=True)
        os.chmod(parent, 0o700)  # makedirs' mode is filtered by the umask
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


# -- capture ----------------------------------------------------------------------------------
def _frames(frame: Any) -> list[dict]:
    out = [
        {"file": fs.filename, "line": fs.lineno, "function": fs.name, "code": fs.line or ""}
        for fs in traceback.extract_stack(frame)
    ]
    return out[-MAX_FRAMES:]


def innermost_user_frame(frames: list[dict]) -> dict | None:
    """Return the innermost frame of the user's own code (see ``_SKIP_DIRS``), else None."""
    for fr in reversed(frames):
        path = os.path.normpath(os.path.abspath(fr["file"])) if fr["file"] else ""
        if fr["file"].startswith("<") or path.startswith(_SKIP_DIRS):
            continue
        if path.startswith(_EXPORTER_DIR) and os.path.basename(path) not in _USER_MODULES_HERE:
            continue
        return fr
    return None


def _phase(frames: list[dict]) -> str:
    """Name what the training thread is doing from its stack (nothing on the hot path)."""
    files = " ".join(f["file"].replace(os.sep, "/") for f in frames)
    functions = {f["function"] for f in frames}
    if "torch/utils/data" in files:
        return "data"
    if "torch/optim" in files:
        return "optimizer"
    if "distributed_c10d.py" in files:
        return "collective"
    if "backward" in functions or "torch/autograd" in files:
        return "backward"
    return "compute"


def _threads(main_ident: int | None) -> list[dict]:
    frames = sys._current_frames()
    by_ident = {t.ident: t for t in threading.enumerate()}
    own = threading.get_ident()
    out = []
    for ident, frame in frames.items():
        t = by_ident.get(ident)
        out.append(
            {
                "name": t.name if t else f"thread-{ident}",
                "ident": ident,
                "daemon": bool(t.daemon) if t else None,
                "training": ident == main_ident,
                "exporter": ident == own,
                "frames": _frames(frame),
            }
        )
    out.sort(key=lambda t: (not t["training"], t["exporter"], t["name"]))
    return out


def _flight_recorder() -> dict:
    c10d = getattr(torch._C, "_distributed_c10d", None)
    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is None:
        return {"available": False, "error": "torch has no _dump_fr_trace"}
    import pickle

    try:
        data = pickle.loads(
            dump(includeCollectives=True, includeStackTraces=True, onlyActive=False)
        )
    except Exception as exc:  # noqa: BLE001 - private API
        return {"available": False, "error": repr(exc)}
    entries = []
    for e in data.get("entries", []) or []:
        if e.get("is_p2p"):
            continue
        name = str(e.get("profiling_name") or "")
        created = e.get("time_created_ns")
        entries.append(
            {
                "op": name.split(":", 1)[-1],
                "seq": int(e.get("collective_seq_id", -1)),
                "pg": str((e.get("process_group") or ("",))[0]),
                "pg_desc": str((e.get("process_group") or ("", ""))[-1]),
                "state": str(e.get("state", "")),
                "retired": bool(e.get("retired")),
                "input_sizes": e.get("input_sizes"),
                "output_sizes": e.get("output_sizes"),
                "dtypes": e.get("input_dtypes"),
                "created_unix": created / 1e9 if created else None,
                "timeout_s": (e.get("timeout_ms") or 0) / 1000.0 or None,
                # FR lists frames innermost first; keep tracebacks' order (outermost first).
                "frames": [
                    {
                        "file": f.get("filename", ""),
                        "line": f.get("line"),
                        "function": f.get("name"),
                    }
                    for f in reversed(e.get("frames") or [])
                ],
            }
        )
    inflight = [e for e in entries if not e["retired"] and e["state"] != "completed"]
    recent: list[dict] = []
    for pg in sorted({e["pg"] for e in entries}):
        recent += [e for e in entries if e["pg"] == pg and e["retired"]][-RECENT_ENTRIES:]
    status = {
        str(pg): {k: v for k, v in s.items() if isinstance(v, (int, float, str))}
        for pg, s in (data.get("pg_status") or {}).items()
    }
    return {"available": True, "pg_status": status, "inflight": inflight, "recent": recent}


def capture(observer: Observer | None = None, main_ident: int | None = None) -> dict:
    """Return this rank's state: every thread's stack, Flight Recorder entries, step, phase."""
    if main_ident is None:
        main_ident = threading.main_thread().ident
    out: dict[str, Any] = {"time_unix": time.time(), "errors": []}
    try:
        out["threads"] = _threads(main_ident)
    except Exception as exc:  # noqa: BLE001
        out["threads"] = []
        out["errors"].append(f"python stacks: {exc!r}")
    if observer is not None and observer.inflight_source.name != "flight_recorder":
        # Turned off (DDP_EXPORTER_FLIGHT_RECORDER=0) or found unusable at start: keep out.
        out["flight_recorder"] = {"available": False, "error": "Flight Recorder not in use"}
    else:
        out["flight_recorder"] = _flight_recorder()
    training = next((t for t in out["threads"] if t["training"]), None)
    out["phase"] = _phase(training["frames"]) if training else "unknown"
    if observer is not None:
        out["step"] = observer.recorder.steps
        try:
            out["seqs"] = {
                s.pg: {"last_enqueued": s.last_enqueued, "last_completed": s.last_completed}
                for s in observer.inflight_source.read()
            }
        except Exception as exc:  # noqa: BLE001
            out["errors"].append(f"in-flight state: {exc!r}")
    return out


def summarize(rank: int, dump: dict) -> dict:
    """Return the short form of a rank's dump that travels through the store as its ack."""
    training = next((t for t in dump.get("threads", []) if t.get("training")), None)
    frames = training["frames"][-ACK_FRAMES:] if training else []
    slim = [{k: f[k] for k in ("file", "line", "function")} for f in frames]
    fr = dump.get("flight_recorder", {})
    inflight = [{k: e[k] for k in ("op", "seq", "pg")} for e in (fr.get("inflight") or [])[:8]]
    return {
        "rank": rank,
        "step": dump.get("step"),
        "phase": dump.get("phase"),
        "frames": slim,
        "where": innermost_user_frame(slim) or (slim[-1] if slim else None),
        "inflight": inflight,
        "seqs": dump.get("seqs", {}),
        "errors": dump.get("errors", []),
    }


def _text(rank: int, dump: dict) -> str:
    lines = [
        f"ddp-exporter hang dump: rank {rank}, episode {dump.get('episode')}, "
        f"run {dump.get('run')}, host {dump.get('host')}, pid {dump.get('pid')}",
        f"step {dump.get('step')}, phase {dump.get('phase')}, "
        f"time {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(dump.get('time_unix', 0)))}",
    ]
    for err in dump.get("errors", []):
        lines.append(f"capture incomplete: {err}")
    for t in dump.get("threads", []):
        tag = " (training thread)" if t["training"] else " (exporter)" if t["exporter"] else ""
        lines += ["", f'Thread "{t["name"]}"{tag}, most recent call last:']
        for f in t["frames"]:
            lines.append(f'  File "{f["file"]}", line {f["line"]}, in {f["function"]}')
            if f.get("code"):
                lines.append(f"    {f['code']}")
    fr = dump.get("flight_recorder", {})
    lines += ["", "Flight Recorder:"]
    if not fr.get("available"):
        lines.append(f"  unavailable: {fr.get('error')}")
    else:
        for title, key in (("in flight", "inflight"), ("recent", "recent")):
            lines.append(f"  {title}:")
            for e in fr.get(key, []):
                lines.append(
                    f"    pg {e['pg']} #{e['seq']} {e['op']} {e['state']} sizes {e['input_sizes']}"
                )
                for f in e["frames"][-6:]:
                    lines.append(f"      {f['file']}:{f['line']} in {f['function']}")
    return "\n".join(lines) + "\n"


# -- the background thread -------------------------------------------------------------------
class Forensics:
    """Report, trigger and answer dump requests on one rank, from one background thread."""

    def __init__(
        self,
        observer: Observer,
        store: dist.Store,
        interval_s: float,
        monitor: bool,
        dump_dir: str,
        errors: ErrorCounter,
        policy: HangPolicy = DEFAULT_POLICY,
    ) -> None:
        self._obs = observer
        self._store = store
        self._run = observer.run
        self.rank = observer.rank
        self.world_size = observer.world_size
        self.interval = interval_s
        self.monitor = monitor
        self.dump_dir = dump_dir
        self.policy = policy
        self._errors = errors
        self._keys = _keys(self._run)
        self._report_keys = [_report_key(self._run, r) for r in range(self.world_size)]
        self._ack_keys = [_ack_key(self._run, r) for r in range(self.world_size)]
        self._main_ident = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick = 0
        self._lat: tuple[float, int] = (0.0, 0)
        self._recent_latency: float | None = None
        self._answered = 0
        self._last_states: list = []
        #: Dumps written by this rank (``ddp_hang_dumps_total``).
        self.dumps = 0
        #: ``(file, line, function)`` while this rank is the culprit of an open episode.
        self.location: tuple[str, str, str] | None = None
        self._location_mark: Any = None
        # Monitoring rank only.
        self._all_keys_exist = False
        self._seen: list[tuple[bytes, float]] | None = None
        self._episode: dict | None = None
        self._blocked_pg: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Publish this rank's keys synchronously (the monitor waits for all), then run."""
        self._store.set(self._report_keys[self.rank], self._report())
        self._store.set(self._ack_keys[self.rank], json.dumps({"episode": 0}))
        self._answered = int(self._store.add(self._keys["episode"], 0))
        self._thread = threading.Thread(
            target=self._run_loop, name="ddp-exporter-forensics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (a daemon: it may be stuck on a dead store)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _run_loop(self) -> None:
        sub = max(self.interval / 4.0, 0.05)
        while not self._stop.wait(sub):
            self._tick += 1
            try:
                full = self._tick % 4 == 0
                if full:
                    self._store.set(self._report_keys[self.rank], self._report())
                if full or self._self_stuck():
                    self._check_request()
                self._update_location()
                # Reports are read every quarter interval (a hang is seen up to 3/4 of an
                # interval sooner); in large jobs once per interval, to bound store traffic.
                if self.monitor and (full or self.world_size <= FAST_WATCH_MAX_RANKS):
                    self._watch()
            except Exception as exc:  # noqa: BLE001 - a dead store must not kill training
                self._errors.record("forensics", exc)

    # -- every rank --------------------------------------------------------------------------
    def _states(self) -> list:
        try:
            return self._obs.inflight_source.read()
        except Exception as exc:  # noqa: BLE001 - same fallback as the scrape path
            self._obs.inflight_failed(exc)
            return self._obs.inflight_source.read()

    def _latency(self) -> float | None:
        """Return the mean collective latency since the last full tick (last known if none)."""
        rec = self._obs.recorder
        with rec.lock:
            total = sum(st.hist.sum for st in rec.collectives)
            count = sum(st.hist.count for st in rec.collectives)
        s0, c0 = self._lat
        if count > c0:
            self._recent_latency = (total - s0) / (count - c0)
            self._lat = (total, count)
        return self._recent_latency

    def _report(self) -> str:
        states = self._states()
        self._last_states = states
        return json.dumps(
            {
                "n": self._tick,
                "pgs": [[s.pg, s.last_enqueued, s.inflight_age_s, s.timeout_s] for s in states],
                "lat": self._latency(),
            }
        )

    def _self_stuck(self) -> bool:
        """Say whether this rank sits in a collective long enough to expect a request soon."""
        states = self._last_states
        return any(s.inflight_age_s > self.policy.stall_min_seconds / 2 for s in states)

    def _check_request(self) -> None:
        episode = int(self._store.add(self._keys["episode"], 0))
        if episode <= self._answered:
            return
        self._answered = episode
        request = json.loads(self._store.get(self._keys["request"]))
        if int(request.get("episode", -1)) != episode:
            return  # a newer request replaced it; the next check answers that one
        summary = self.dump(episode, request)
        self._store.set(
            self._ack_keys[self.rank], json.dumps({"episode": episode, "summary": summary})
        )

    def dump(self, episode: int, request: dict) -> dict:
        """Write this rank's dump for ``episode``; return its summary (the ack).

        A dump folder that cannot be written still gets an ack (with the error in it): the
        monitoring rank must not mistake a full disk for a frozen rank.
        """
        folder = episode_dir(self.dump_dir, self._run, episode)
        base = os.path.join(folder, f"rank-{self.rank}")
        fallback = None
        try:
            _makedirs_private(folder)
            fd = os.open(base + ".txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            fallback = os.fdopen(fd, "w")
            fallback.write(
                f"ddp-exporter hang dump: rank {self.rank}, episode {episode}: the Python "
                "capture did not finish; C-level stacks from faulthandler follow.\n"
            )
            fallback.flush()
        except OSError as exc:
            self._errors.record("forensics", exc)
        # C-level fallback: if this thread cannot get the GIL back (a thread holding it in C
        # code), faulthandler's own watchdog thread still writes every thread's stack there.
        # (It replaces a dump_traceback_later the application armed itself, for this moment.)
        try:
            if fallback is not None:
                faulthandler.dump_traceback_later(FAULTHANDLER_S, repeat=False, file=fallback)
            try:
                data = capture(self._obs, self._main_ident)
            finally:
                if fallback is not None:
                    faulthandler.cancel_dump_traceback_later()
        finally:
            if fallback is not None:
                fallback.close()
        data.update(
            episode=episode,
            run=self._run,
            rank=self.rank,
            world_size=self.world_size,
            host=socket.gethostname(),
            pid=os.getpid(),
            request=request,
        )
        summary = summarize(self.rank, data)
        data["summary"] = summary
        try:
            _write_private(base + ".json", json.dumps(data, indent=1, default=str))
            _write_private(base + ".txt", _text(self.rank, data))
            self.dumps += 1
        except OSError as exc:
            self._errors.record("forensics", exc)
            summary["errors"] = [*summary["errors"], f"dump files not written: {exc!r}"]
        if self.rank in request.get("behind", ()) and summary.get("where"):
            w = summary["where"]
            self.location = (w["file"], str(w["line"]), w["function"])
            self._location_mark = self._progress_mark()
        return summary

    def _progress_mark(self) -> tuple:
        states = self._last_states
        return (self._obs.recorder.steps, tuple(sorted((s.pg, s.last_enqueued) for s in states)))

    def _update_location(self) -> None:
        """Drop the published location once this rank progresses again (episode over)."""
        if self.location is not None and self._progress_mark() != self._location_mark:
            self.location = None

    # -- monitoring rank ---------------------------------------------------------------------
    def _watch(self) -> None:
        if not self._all_keys_exist:
            keys = self._report_keys + self._ack_keys
            if not self._store.check(keys):
                return
            self._all_keys_exist = True
        raw = self._store.multi_get(self._report_keys)
        now = time.monotonic()
        if self._seen is None:
            self._seen = [(v, now) for v in raw]
        else:
            self._seen = [(v, t if v == old else now) for v, (old, t) in zip(raw, self._seen)]
        states, lats, last = [], [], {}
        for rank, (value, seen_at) in enumerate(self._seen):
            rep = json.loads(value)
            if rep.get("lat"):
                lats.append(float(rep["lat"]))
            # The report is up to an interval old: age it by the time since it changed.
            for pg, enq, age, tmo in rep.get("pgs", []):
                age = float(age) + (now - seen_at) if age else 0.0
                states.append(SeqState(rank, str(pg), float(enq), age, tmo))
                last[(rank, str(pg))] = enq
        lats.sort()
        normal = lats[len(lats) // 2] if lats else None
        findings = find_hangs(states, normal, self.policy)
        ep = self._episode
        if ep is not None:
            self._collect(ep, last)
        if self._blocked_pg is not None and not any(f.pg == self._blocked_pg for f in findings):
            self._blocked_pg = None  # progress resumed: the next hang is a new episode
        if self._episode is None and self._blocked_pg is None:
            act = [f for f in findings if f.kind in ("behind", "symmetric")]
            if act:
                act.sort(key=lambda f: f.kind != "behind")
                self._open(act[0])
                self._check_request()  # the monitoring rank dumps at once

    def _open(self, finding: HangFinding) -> None:
        request = {
            "pg": finding.pg,
            "kind": finding.kind,
            "seq": finding.seq,
            "behind": list(finding.behind),
            "waiting": list(finding.waiting),
            "age": finding.age,
            "threshold": finding.threshold,
            "requested_unix": time.time(),
        }
        # Publish the request before bumping the counter: a rank that sees the new number
        # always finds its request. Only the monitoring rank writes either key.
        number = int(self._store.add(self._keys["episode"], 0)) + 1
        request["episode"] = number
        self._store.set(self._keys["request"], json.dumps(request))
        self._store.add(self._keys["episode"], 1)
        self._blocked_pg = finding.pg
        deadline = time.monotonic() + 3 * self.interval + FAULTHANDLER_S + 2.0
        self._episode = {"request": request, "deadline": deadline, "acks": {}}
        log.warning(
            "ddp-exporter: hang detected in run %s (pg %s, %s, seq %g, oldest in flight %.1fs "
            "> %.1fs); asking every rank for a dump (episode %d)",
            self._run,
            finding.pg,
            finding.kind,
            finding.seq,
            finding.age,
            finding.threshold,
            number,
        )

    def _collect(self, ep: dict, last: dict) -> None:
        number = ep["request"]["episode"]
        acks = ep["acks"]
        missing = [r for r in range(self.world_size) if r not in acks]
        if missing:
            for rank, value in zip(
                missing, self._store.multi_get([self._ack_keys[r] for r in missing])
            ):
                ack = json.loads(value)
                if int(ack.get("episode", 0)) == number:
                    acks[rank] = ack.get("summary") or {"rank": rank}
        if len(acks) < self.world_size and time.monotonic() < ep["deadline"]:
            return
        self._episode = None
        last_seq = {r: v for (r, pg), v in last.items() if pg == ep["request"]["pg"]}
        episode = dict(
            ep["request"],
            run=self._run,
            world_size=self.world_size,
            answered=sorted(acks),
            missing=[r for r in range(self.world_size) if r not in acks],
            last_enqueued=last_seq,
            complete_unix=time.time(),
        )
        summaries: dict[int, dict | None] = {r: acks.get(r) for r in range(self.world_size)}
        verdict = hangs.verdict(episode, summaries)
        text = hangs.render(verdict)
        folder = episode_dir(self.dump_dir, self._run, number)
        try:
            _makedirs_private(folder)
            episode["summaries"] = {str(r): s for r, s in summaries.items()}
            _write_private(os.path.join(folder, "episode.json"), json.dumps(episode, indent=1))
            _write_private(os.path.join(folder, "verdict.txt"), text)
        except OSError as exc:
            self._errors.record("forensics", exc)
        log.warning(
            "%s",
            "\n".join(f"{hangs.MARKER} {line}" for line in text.rstrip("\n").splitlines()),
        )
