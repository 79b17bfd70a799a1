"""Print the doctor's verdict: rank 0's table, and a rank's own failures."""

from __future__ import annotations

from .checks import CHECKS, MISSING, NA, VERSION_KEYS, WARN, Check, Report, ranks_text

__all__ = [
    "own_failures",
    "render",
]


def render(
    rows: list[Report | int],
    notes: list[str],
    missing_fix: str,
    columns: tuple[str, ...] = CHECKS,
) -> str:
    """Return the table, one row per rank, then every failure and warning with its fix."""
    header = ["rank", "host", *columns]
    table = [header]
    problems: list[str] = []
    warned: dict[tuple[str, str, str], list[int | None]] = {}
    for row in rows:
        if isinstance(row, int):
            table.append([str(row), "?", MISSING] + [""] * (len(columns) - 1))
            problems.append(f"rank {row} missing: {missing_fix}")
            continue
        cells = [str(row.rank), row.host]
        cells += [(row.checks.get(n) or Check(NA)).status for n in columns]
        table.append(cells)
        for name, check in row.failures():
            problems.append(f"rank {row.rank} {name}: {check.detail}. Fix: {check.fix}")
        for name in columns:
            found = row.checks.get(name)
            if found is not None and found.status == WARN:
                warned.setdefault((name, found.detail, found.fix), []).append(row.rank)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    present = [r for r in rows if isinstance(r, Report)]
    if present and not any(n.startswith("version skew") for n in notes):
        v = present[0].versions
        every = "every rank" if len(present) == len(rows) else "every rank that reported"
        notes = [", ".join(f"{k} {v.get(k)}" for k in VERSION_KEYS) + f" on {every}", *notes]
    lines += notes
    lines += [f"FAIL {p}" for p in problems]
    lines += [
        f"WARN {ranks_text(ranks)} {name}: {detail}. Fix: {fix}"
        for (name, detail, fix), ranks in warned.items()
    ]
    return "\n".join(lines)


def own_failures(rep: Report) -> str:
    return "\n".join(
        f"ddp-exporter doctor rank {'?' if rep.rank is None else rep.rank}: "
        f"FAIL {name}: {c.detail}. Fix: {c.fix}"
        for name, c in rep.failures()
    )
