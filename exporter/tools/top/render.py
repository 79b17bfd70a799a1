"""Format ``top``'s table: the worst ranks first, one line each, and the run's restart state."""

from __future__ import annotations

import time

from .rows import RankRow

__all__ = ["render", "restart_line"]


def _badness(r: RankRow) -> tuple:
    order = {"DOWN": 0, "HUNG": 1, "STUCK": 2, "straggler": 3, "finished": 6}
    rank = next((o for prefix, o in order.items() if r.verdict.startswith(prefix)), 4)
    return (rank if r.verdict else 5 - bool(r.note), -r.phases.get("compute", 0.0), r.rank)


def render(
    rows: list[RankRow], worst: int = 20, now: float | None = None, color: bool = False
) -> str:
    """Format the table, worst ranks first, at most ``worst`` rows."""
    now = time.time() if now is None else now
    head = (
        f"{'rank':>5} {'step ms':>8} {'data':>7} {'compute':>8} {'comm_wt':>8} {'optim':>7} "
        f"{'coll ms':>8} {'inflight/timeout':>17} {'seq lag':>7} {'hb age':>7} {'mem MiB':>8}  verdict"
    )
    lines = [head]
    shown = sorted(rows, key=_badness)[:worst]
    for r in shown:
        ph = r.phases
        hb = f"{now - r.heartbeat:6.1f}s" if r.heartbeat else "      -"
        line = (
            f"{r.rank if r.rank >= 0 else '?':>5} {r.step_time * 1e3:8.1f} "
            f"{ph.get('data', 0) * 1e3:7.1f} {ph.get('compute', 0) * 1e3:8.1f} "
            f"{ph.get('comm_wait', 0) * 1e3:8.1f} {ph.get('optimizer', 0) * 1e3:7.1f} "
            f"{r.coll_latency * 1e3:8.2f} {r.inflight_age:7.1f}/{r.timeout:<9.0f} "
            f"{r.seq_lag:7.0f} {hb:>7} {r.memory / 2**20:8.0f}  "
            + (r.verdict or (f"({r.note})" if r.note else ""))
        )
        if color and r.verdict:
            line = f"\x1b[1;31m{line}\x1b[0m"
        lines.append(line)
    if len(rows) > len(shown):
        lines.append(f"... {len(rows) - len(shown)} more ranks (healthiest hidden)")
    restarts = restart_line(rows)
    if restarts:
        lines.append(restarts)
    return "\n".join(lines)


def restart_line(rows: list[RankRow]) -> str:
    """Return the run's restart state in one line (attempt, hang aborts), "" when unremarkable."""
    attempts = sorted({r.attempt for r in rows if r.attempt}, key=lambda a: (len(a), a))
    monitor = next((r for r in rows if r.abort_limit >= 0), None)
    current = attempts[-1] if attempts else "0"
    if monitor is None and current == "0":
        return ""
    parts = [f"restarts: attempt {current}"]
    if monitor is not None:
        streak, limit = int(monitor.abort_streak), int(monitor.abort_limit)
        parts.append(
            f"hang aborts without progress {streak} of {limit}"
            if limit
            else f"hang aborts without progress {streak} (no limit)"
        )
        earlier = [
            f"attempt {a}: "
            + (f"rank {cr} on {node or '?'}" if cr else "every rank stuck")
            + f", step {step:.0f}"
            for a, cr, node, step in sorted(
                monitor.aborted_attempts, key=lambda x: (len(x[0]), x[0])
            )
        ]
        if earlier:
            parts.append("aborted " + "; ".join(earlier))
        if 0 < limit <= streak:
            parts.append("RESTART LOOP: the hang action stopped")
    return "; ".join(parts)
