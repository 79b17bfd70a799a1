"""Capture where one rank is: every thread's stack, the training thread first, and its summary.

:func:`capture_state` runs on the hang watcher's thread, never on the training thread; what it
reads of the Flight Recorder and of the in-flight state is handed to it as callables, so this
module imports no torch and :func:`summary_of` also serves ``ddp-exporter hangs`` on a laptop.
:func:`capture`, :func:`summarize` and :func:`innermost_user_frame` are the same in the JSON form
of a dump file, for tools.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

from ..sources.training import or_main_thread
from . import codec
from .protocol import Frame, InflightOp, PgSeqs, RankState, Summary, ThreadStack

__all__ = [
    "ACK_FRAMES",
    "MAX_FRAMES",
    "capture",
    "capture_state",
    "innermost_user_frame",
    "phase",
    "summarize",
    "summary_of",
    "user_frame",
]

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


def _frames(frame: FrameType) -> tuple[Frame, ...]:
    out = [
        Frame(fs.filename, fs.lineno, fs.name, fs.line or "")
        for fs in traceback.extract_stack(frame)
    ]
    return tuple(out[-MAX_FRAMES:])


def user_frame(frames: Sequence[Frame]) -> Frame | None:
    """Return the innermost frame of the user's own code (see ``_SKIP_DIRS``), else None."""
    for fr in reversed(frames):
        path = os.path.normpath(os.path.abspath(fr.file)) if fr.file else ""
        if fr.file.startswith("<") or path.startswith(_SKIP_DIRS):
            continue
        if path.startswith(_PACKAGE_DIR) and not path.startswith(_TOOLS_DIR):
            continue
        return fr
    return None


def innermost_user_frame(frames: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Return :func:`user_frame` of frames in their JSON form, in that form (for tools)."""
    found = user_frame([codec.frame_from_dict(f) for f in frames])
    return None if found is None else codec.frame_to_dict(found)


def phase(frames: Sequence[Frame]) -> str:
    """Name what the training thread is doing from its stack (nothing on the hot path)."""
    files = " ".join(f.file.replace(os.sep, "/") for f in frames)
    functions = {f.function for f in frames}
    if "torch/utils/data" in files:
        return "data"
    if "torch/optim" in files:
        return "optimizer"
    if "distributed_c10d.py" in files:
        return "collective"
    if "backward" in functions or "torch/autograd" in files:
        return "backward"
    return "compute"


def _threads(training_ident: int | None) -> list[ThreadStack]:
    frames = sys._current_frames()
    by_ident = {t.ident: t for t in threading.enumerate()}
    own = threading.get_ident()
    out = []
    for ident, frame in frames.items():
        t = by_ident.get(ident)
        out.append(
            ThreadStack(
                name=t.name if t else f"thread-{ident}",
                ident=ident,
                daemon=bool(t.daemon) if t else None,
                training=ident == training_ident,
                exporter=ident == own,
                frames=_frames(frame),
            )
        )
    out.sort(key=lambda t: (not t.training, t.exporter, t.name))
    return out


def capture_state(
    *,
    training_ident: int | None = None,
    flight_recorder: Callable[[], Mapping[str, Any]] | None = None,
    step: int | None = None,
    seqs: Callable[[], Mapping[str, PgSeqs]] | None = None,
) -> RankState:
    """Return this rank's state: every thread's stack, Flight Recorder entries, step, phase.

    ``flight_recorder`` returns the Flight Recorder's entries (None: not in use on this rank);
    ``seqs`` returns the last enqueued/completed sequence number per process group.
    """
    now = time.time()
    errors: list[str] = []
    try:
        threads = _threads(or_main_thread(training_ident))
    except Exception as exc:  # noqa: BLE001
        threads = []
        errors.append(f"python stacks: {exc!r}")
    fr: Mapping[str, Any]
    if flight_recorder is None:
        # Turned off (DDP_EXPORTER_FLIGHT_RECORDER=0) or found unusable at start: keep out.
        fr = codec.flight_unavailable("Flight Recorder not in use")
    else:
        fr = flight_recorder()
    training = next((t for t in threads if t.training), None)
    read: Mapping[str, PgSeqs] | None = None
    if seqs is not None:
        try:
            read = seqs()
        except Exception as exc:  # noqa: BLE001
            errors.append(f"in-flight state: {exc!r}")
    return RankState(
        now,
        tuple(errors),
        tuple(threads),
        fr,
        phase(training.frames) if training else "unknown",
        step,
        read,
    )


def capture(
    *,
    training_ident: int | None = None,
    flight_recorder: Callable[[], Mapping[str, Any]] | None = None,
    step: int | None = None,
    seqs: Callable[[], Mapping[str, PgSeqs]] | None = None,
) -> dict[str, Any]:
    """Return :func:`capture_state` in the JSON form of a dump file (for tools)."""
    state = capture_state(
        training_ident=training_ident, flight_recorder=flight_recorder, step=step, seqs=seqs
    )
    return codec.state_to_dict(state)


def summary_of(rank: int, state: RankState) -> Summary:
    """Return the short form of a rank's state that travels through the store in its ack."""
    training = next((t for t in state.threads if t.training), None)
    frames = training.frames[-ACK_FRAMES:] if training else ()
    slim = tuple(dataclasses.replace(f, code=None) for f in frames)
    inflight = tuple(
        InflightOp(e.op, e.seq, e.pg, e.pg_desc, e.state)
        for e in codec.flight_entries(state.flight_recorder, "inflight")[:8]
    )
    return Summary(
        rank=rank,
        step=state.step,
        phase=state.phase,
        frames=slim,
        where=user_frame(slim) or (slim[-1] if slim else None),
        inflight=inflight,
        seqs=dict(state.seqs or {}),
        errors=state.errors,
    )


def summarize(rank: int, dump: Mapping[str, Any]) -> dict[str, Any]:
    """Return :func:`summary_of` a dump file's JSON form, in the JSON form of an ack's summary."""
    return codec.summary_to_dict(summary_of(rank, codec.state_from_dict(dump)))
