"""Build the goodput alert: a run turns too little of its time into training.

A run's account (:mod:`exporter.sources.goodput`, the ``ddp_goodput_*`` series of its monitoring
rank) says where every second went. DDPGoodputLow judges the time that was not planned: the wall
clock less startup and declared sections (checkpoint, evaluation), which a healthy job spends by
design and their own alerts judge (DDPInitStuck, DDPSectionOverdue). It fires for a run that is
still training, names the largest loss and, for a straggler or a hang, the rank and node that
cost it. A run that ended cleanly, or whose monitoring rank is gone, is no longer judged.
"""

from __future__ import annotations

from ... import catalog
from ..alert import Alert, selector
from ..cluster import clauses
from ..config import DEFAULT, MixinConfig, duration_seconds
from ..prose import spoken_duration
from ..recording import PLANNED, recorded, unplanned_seconds
from .shared import finished_ranks

__all__ = ["UNPLANNED_BADPUT", "goodput_alerts", "goodput_low"]

#: The badput categories DDPGoodputLow weighs (catalog.GOODPUT_CATEGORIES less productive and
#: planned time).
UNPLANNED_BADPUT: tuple[str, ...] = tuple(
    c for c in catalog.GOODPUT_CATEGORIES if c != "productive" and c not in PLANNED
)
#: Categories whose time is blamed on a rank and its node (exporter.sources.goodput's BLAMED).
BLAMED: tuple[str, ...] = ("straggler", "hang")


def goodput_alerts(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return DDPGoodputLow."""
    return [goodput_low(cfg)]


def _expr(cfg: MixinConfig) -> str:
    """Return the runs below the threshold, with their largest loss and who caused it."""
    r, c = recorded(cfg), clauses(cfg)
    run = c.on("run")
    live = f"max {c.by('run')} ({selector(cfg, catalog.GOODPUT.name)})"
    evidence = duration_seconds(cfg.goodput_window) * cfg.goodput_min_evidence
    unplanned = unplanned_seconds(cfg)
    low = (
        f"(\n  {r.unplanned_ettr} < {cfg.goodput_min_ettr:g}\n"
        f"  and {run} {live}\n  and {run} {unplanned} >= {evidence:g}\n"
        f"  unless {run} max {c.by('run')} ({finished_ranks(cfg)})\n)"
    )
    badput = f'{r.goodput_short}{{category=~"{"|".join(UNPLANNED_BADPUT)}"}}'
    largest = f"(topk {c.by('run')} (1, {badput}) * 0 + 1)"
    with_category = f"{low}\n* {run} group_left (category)\n{largest}"
    blamed = f'{r.blame_short}{{category=~"{"|".join(BLAMED)}"}}'
    culprit = f"(topk {c.by('run, category')} (1, {blamed}) * 0 + 1)"
    return (
        f"(\n{with_category}\n)\n* {c.on('run, category')} group_left (culprit_rank, node)\n"
        f"{culprit}\nor {run}\n{with_category}"
    )


def goodput_low(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPGoodputLow: a run's unplanned time is mostly lost, and to what."""
    window, floor = cfg.goodput_window, f"{cfg.goodput_min_ettr:.0%}"
    planned = ", ".join(PLANNED)
    return Alert(
        "DDPGoodputLow",
        "warning",
        _expr(cfg),
        cfg.goodput_for,
        "A run turns too little of its time into training.",
        (
            "Run {{ $labels.run }} trained productively only {{ $value | humanizePercentage }} "
            f"of its unplanned time over the last {window} (below {floor}): the largest loss is "
            "{{ $labels.category }}"
            "{{ if $labels.culprit_rank }}, which rank {{ $labels.culprit_rank }}"
            "{{ if $labels.node }} on node {{ $labels.node }}{{ end }} cost it{{ end }}."
        ),
        "The run's monitoring rank accounts for every second of its wall clock "
        "(`ddp_goodput_seconds_total{category}`): productive training, each step counted once "
        "at the healthy pace, and each kind of badput. This alert weighs the time that was not "
        f"planned, leaving out {planned} (their own alerts judge them: a checkpoint within its "
        f"deadline never pages), and fires when less than {floor} of it was productive over "
        f"the last {spoken_duration(window)}, for {spoken_duration(cfg.goodput_for)}. The "
        "category label names the largest loss: data (the input pipeline), communication "
        "(beyond the run's healthy baseline), straggler (the time the other ranks waited for "
        "one rank, named with its node), hang and restart (a hang, the abort and the way back), "
        "lost_work (steps redone from an older checkpoint) or other. A run that ended cleanly "
        "is not judged, nor a window holding less than "
        f"{cfg.goodput_min_evidence:.0%} of its length in unplanned time (a run's first "
        "minutes, a window spent in declared sections).",
        "Goodput dashboard: ETTR over time, where the time went (stacked) and the ranks and "
        "nodes that cost the most; `ddp-exporter goodput --prometheus URL --run RUN` prints the "
        "account; the run's summary `<dump_dir>/<run>-goodput.txt` at its end.",
        "straggler: follow DDPRankStraggler for the named rank (its node's GPU, CPU load or "
        "data). data: raise the DataLoader's workers or prefetching (DDPInputBound). "
        "communication: check the network (`ddp-exporter doctor --links`). hang, restart: read "
        "the hang verdict (`ddp-exporter hangs DUMP_DIR`); a node that keeps hanging runs "
        "belongs drained. lost_work: checkpoint more often, or resume from the latest "
        "checkpoint. other: a gap outside steps the exporter cannot place (a long tail at the "
        "end, an undeclared pause).",
        scope="run",
    )
