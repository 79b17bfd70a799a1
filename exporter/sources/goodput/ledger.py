"""Keep the run's account on disk: ``<dump_dir>/<run>-goodput.json``, next to the hang dumps.

The monitoring rank rewrites the file as its account grows (at most once a second, whole or not
at all) and at the end; the next attempt's monitoring rank reads it and carries the account on,
so that a restarted run keeps its counters' meaning and an aborted or killed attempt's last
seconds are not lost: whatever the earlier attempt had not placed is ``other``, the time from its
end to this attempt's first step ``restart``.

**Chain.** An attempt continues the file only when it is a later attempt of the same run (its
attempt number is greater than the file's). Attempt 0 (a new job reusing the run name) starts
afresh, as the restart ledger does (:mod:`exporter.hangs.restarts`).
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any

from .account import Carried

__all__ = ["FORMAT", "goodput_path", "load_carried", "save", "summary_path"]

#: The file's format version (a key of its own, so other JSON is never read as an account).
FORMAT = 1


def _safe(run: str) -> str:
    """Return ``run`` as a file name, as the hang dumps name it."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run).strip("._") or "run"


def goodput_path(dump_dir: str, run: str) -> str:
    """Return the file holding ``run``'s account (JSON)."""
    return os.path.join(dump_dir, f"{_safe(run)}-goodput.json")


def summary_path(dump_dir: str, run: str) -> str:
    """Return the file holding ``run``'s summary (text), written at the end."""
    return os.path.join(dump_dir, f"{_safe(run)}-goodput.txt")


def save(path: str, text: str) -> None:
    """Write ``path`` whole or not at all, readable by this user only, its folder too."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # two writers never share it
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
    os.replace(tmp, path)


def load_carried(dump_dir: str, run: str, attempt: str) -> Carried | None:
    """Return what the run's earlier attempts left, None when this attempt starts afresh.

    Raises OSError or ValueError for a file that exists but cannot be read.
    """
    if not attempt.isdigit() or int(attempt) == 0:
        return None
    try:
        with open(goodput_path(dump_dir, run), encoding="utf-8") as f:
            data: Any = json.load(f)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict) or data.get("ddp_exporter_goodput") != FORMAT:
        raise ValueError(f"{goodput_path(dump_dir, run)} is not a goodput account")
    attempts = [str(a) for a in data.get("attempts", ())]
    if data.get("run") != run or not attempts or not attempts[-1].isdigit():
        return None
    if int(attempts[-1]) >= int(attempt):
        return None
    return _carried(data, attempts)


def _carried(data: dict[str, Any], attempts: list[str]) -> Carried:
    blame: dict[tuple[str, int], float] = {}
    nodes: dict[int, str] = {}
    for item in data.get("blame", ()):
        culprit = int(item["culprit_rank"])
        blame[(str(item["category"]), culprit)] = float(item["seconds"])
        if item.get("node"):
            nodes[culprit] = str(item["node"])
    furthest = data.get("furthest_step")
    baseline = data.get("baseline_comm_per_step_s")
    return Carried(
        run_start_unix=float(data["run_start_unix"]),
        until_unix=float(data["until_unix"]),
        totals={str(k): float(v) for k, v in data.get("totals", {}).items()},
        blame=blame,
        nodes=nodes,
        furthest_step=int(furthest) if furthest is not None else None,
        baseline_s=float(baseline) if baseline is not None else None,
        attempts=tuple(attempts),
        split={str(k): float(v) for k, v in data.get("split", {}).items()},
        stragglers=list(data.get("stragglers", ())),
        hangs=list(data.get("hangs", ())),
    )
