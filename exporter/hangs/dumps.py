"""Lay hang dumps out on disk: one folder per episode, user-only files, a readable text form.

An episode's folder has the same name on every node (``<run>-hang-<episode>`` under the dump
folder, ``<run>-attempt-<N>-hang-<episode>`` in a restarted attempt N, so that a restart never
overwrites the dumps of the attempt it replaced); each rank writes ``rank-N.json`` and ``rank-N.txt`` there, the monitoring rank also
``episode.json`` and ``verdict.txt``. Folders are 0o700 and files 0o600: stacks reveal
internals and stay on the local disk.
"""

from __future__ import annotations

import os
import re
import time

from . import codec, spans
from .protocol import RankDump

__all__ = [
    "EPISODE_GLOB",
    "episode_dir",
    "makedirs_private",
    "render_dump",
    "replace_private",
    "safe_run",
    "write_private",
]

#: Matches every episode folder under a dump folder.
EPISODE_GLOB = "*-hang-*"


def safe_run(run: str) -> str:
    """Return ``run`` as a file name: anything but letters, digits, ``_.-`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run).strip("._") or "run"


def episode_dir(dump_dir: str, run: str, episode: int, attempt: str = "0") -> str:
    """Return the folder holding one episode's dumps (same name on every node)."""
    part = "" if attempt == "0" else f"-attempt-{attempt}"
    return os.path.join(dump_dir, f"{safe_run(run)}{part}-hang-{episode}")


def makedirs_private(path: str) -> None:
    """Create ``path`` (and a missing parent) readable by this user only."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o700, exist_ok=True)
        os.chmod(parent, 0o700)  # makedirs' mode is filtered by the umask
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` with user-only permissions (0o600), whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


def replace_private(path: str, text: str) -> None:
    """Write ``path`` whole or not at all (user-only): several ranks may write the same file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    write_private(tmp, text)
    os.replace(tmp, path)


def render_dump(rank: int, dump: RankDump) -> str:
    """Return one rank's dump as text: where it is in each process group's collectives (in the
    words of the verdict, :mod:`exporter.hangs.spans`), every thread's stack, then the Flight
    Recorder."""
    state = dump.state
    lines = [
        f"ddp-exporter hang dump: rank {rank}, episode {dump.episode}, "
        f"run {dump.run}, host {dump.host}, pid {dump.pid}",
        f"step {state.step}, phase {state.phase}, "
        f"time {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(state.time_unix))}",
    ]
    for pg, seqs in sorted((state.seqs or {}).items()):
        done, entered = seqs.last_completed, seqs.last_enqueued
        if entered > done:
            lines.append(
                f"pg {pg}: in flight {spans.stuck(done, entered)}; last completed "
                f"{spans.number(done)}"
            )
        else:
            lines.append(f"pg {pg}: nothing in flight; last entered {spans.number(entered)}")
    for err in state.errors:
        lines.append(f"capture incomplete: {err}")
    for t in state.threads:
        tag = " (training thread)" if t.training else " (exporter)" if t.exporter else ""
        lines += ["", f'Thread "{t.name}"{tag}, most recent call last:']
        for f in t.frames:
            lines.append(f'  File "{f.file}", line {f.line}, in {f.function}')
            if f.code:
                lines.append(f"    {f.code}")
    fr = state.flight_recorder
    lines += ["", "Flight Recorder:"]
    if not codec.flight_available(fr):
        lines.append(f"  unavailable: {codec.flight_error(fr)}")
    else:
        for title, which in (("in flight", "inflight"), ("recent", "recent")):
            lines.append(f"  {title}:")
            for e in codec.flight_entries(fr, which):
                lines.append(f"    pg {e.pg} #{e.seq} {e.op} {e.state} sizes {e.input_sizes}")
                for f in e.frames[-6:]:
                    lines.append(f"      {f.file}:{f.line} in {f.function}")
    return "\n".join(lines) + "\n"
