"""Capture where one rank is: every thread's stack, the training thread first, and its summary.

:func:`capture` runs on the hang watcher's thread, never on the training thread; what it reads
of the Flight Recorder and of the in-flight state is handed to it as callables, so this module
imports no torch and :func:`summarize` also serves ``ddp-exporter hangs`` on a laptop.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["ACK_FRAMES", "MAX_FRAMES", "capture", "innermost_user_frame", "phase", "summarize"]

#: Frames kept per thread (innermost ones): deep recursion must not bloat a dump.
MAX_FRAMES = 100
#: Frames of the training thread carried in the ack through the store.
ACK_FRAMES = 40


def _torch_dir() -> str | None:
    """Return where torch is installed, without importing it."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return locations[0] if locations else None


#: Frames under these folders are not "where the user's code is stuck": torch, the standard
#: library and installed packages (Lightning, transformers: their caller is the user's code).
_SKIP_DIRS = tuple(
    os.path.normpath(p) + os.sep
    for p in {
        _torch_dir(),
        *(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
    if p
)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: The exporter's own library is not the user's code; its tools (the demo trainer) are.
_TOOLS_DIR = os.path.join(_PACKAGE_DIR, "tools") + os.sep


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
        if path.startswith(_PACKAGE_DIR) and not path.startswith(_TOOLS_DIR):
            continue
        return fr
    return None


def phase(frames: list[dict]) -> str:
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


def capture(
    *,
    main_ident: int | None = None,
    flight_recorder: Callable[[], dict] | None = None,
    step: int | None = None,
    seqs: Callable[[], dict] | None = None,
) -> dict:
    """Return this rank's state: every thread's stack, Flight Recorder entries, step, phase.

    ``flight_recorder`` returns the Flight Recorder's entries (None: not in use on this rank);
    ``seqs`` returns the last enqueued/completed sequence number per process group.
    """
    if main_ident is None:
        main_ident = threading.main_thread().ident
    out: dict[str, Any] = {"time_unix": time.time(), "errors": []}
    try:
        out["threads"] = _threads(main_ident)
    except Exception as exc:  # noqa: BLE001
        out["threads"] = []
        out["errors"].append(f"python stacks: {exc!r}")
    if flight_recorder is None:
        # Turned off (DDP_EXPORTER_FLIGHT_RECORDER=0) or found unusable at start: keep out.
        out["flight_recorder"] = {"available": False, "error": "Flight Recorder not in use"}
    else:
        out["flight_recorder"] = flight_recorder()
    training = next((t for t in out["threads"] if t["training"]), None)
    out["phase"] = phase(training["frames"]) if training else "unknown"
    if step is not None:
        out["step"] = step
    if seqs is not None:
        try:
            out["seqs"] = seqs()
        except Exception as exc:  # noqa: BLE001
            out["errors"].append(f"in-flight state: {exc!r}")
    return out


def summarize(rank: int, dump: dict) -> dict:
    """Return the short form of a rank's dump that travels through the store as its ack."""
    training = next((t for t in dump.get("threads", []) if t.get("training")), None)
    frames = training["frames"][-ACK_FRAMES:] if training else []
    slim = [{k: f[k] for k in ("file", "line", "function")} for f in frames]
    fr = dump.get("flight_recorder", {})
    inflight = [
        {"op": e["op"], "seq": e["seq"], "pg": e["pg"], "pg_desc": e.get("pg_desc", "")}
        for e in (fr.get("inflight") or [])[:8]
    ]
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
