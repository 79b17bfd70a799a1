"""Write what alerts of several domains read: ranks that ended, runs the hang action ended.

A job has edges, and every domain must respect them: a rank that ended cleanly is neither down
nor behind; a run the hang action ended is neither killed nor stalled while its launcher
restarts it. The vectors here say so once. :func:`hang_location` is the description suffix of
every alert that names a hung rank.
"""

from __future__ import annotations

from ... import catalog
from ..alert import selector
from ..cluster import clauses
from ..config import DEFAULT, MixinConfig, duration_seconds
from ..recording import recorded

__all__ = [
    "WHERE",
    "compute_straggler",
    "printf_selector",
    "slower_than_peers",
    "aborted_runs",
    "finished_ranks",
    "hang_location",
    "hang_network",
    "looping_runs",
    "with_role",
]

#: How a description names the alert's rank.
WHERE = "rank {{ $labels.rank }} of run {{ $labels.run }}"


def with_role(expr: str, role: str) -> str:
    """Return ``expr`` with a constant ``role`` label (behind = never entered, waiting = stuck)."""
    return f'label_replace(\n{expr},\n"role", "{role}", "run", ".*")'


def finished_ranks(cfg: MixinConfig) -> str:
    """Return a (run, rank) vector of the ranks that ended cleanly within the baseline window."""
    return (
        f"max {clauses(cfg).by('run, rank')} (last_over_time("
        f"{selector(cfg, catalog.FINISHED.name)}[{cfg.baseline_window}]))"
    )


def aborted_runs(cfg: MixinConfig) -> str:
    """Return a (run, culprit_rank, node) vector of the runs the hang action ended recently."""
    metric = selector(cfg, catalog.HANG_ABORT.name)
    by = clauses(cfg).by("run, culprit_rank, node")
    return f"max {by} (last_over_time({metric}[{cfg.hang_abort_window}]))"


def looping_runs(cfg: MixinConfig) -> str:
    """Return a (run) vector of the runs whose hang action stopped: aborts without progress."""
    c = clauses(cfg)
    streak = selector(cfg, catalog.HANG_ABORT_STREAK.name)
    limit = selector(cfg, catalog.HANG_ABORT_LIMIT.name)
    w = cfg.restart_loop_window
    return (
        f"max {c.by('run')} (last_over_time({streak}[{w}]))\n>= {c.on('run')}\n"
        f"(max {c.by('run')} (last_over_time({limit}[{w}])) > 0)"
    )


def slower_than_peers(cfg: MixinConfig, phases: str) -> str:
    """Return the ranks slower than their run's typical rank in the phases ``phases`` matches.

    DDPRankStraggler's definition, one place for every alert that names a straggler: the phase
    time per step over the run's median by ``straggler_ratio`` and by at least
    ``straggler_min_excess_seconds``. ``phases`` is a label matcher on ``phase``.

    Not a rank that waits for a later one, as ``top`` says it: where another rank's compute and
    data time per step exceed its own by the same thresholds, that rank sets the pace and this
    one waits for it like its peers (a rank slow in compute while another waits far longer for
    its data; on a busy host the monitoring rank's compute is the first to grow).
    """
    r, c = recorded(cfg), clauses(cfg)
    ratio, excess = cfg.straggler_ratio, cfg.straggler_min_excess_seconds

    def latest(op: str) -> str:
        # The run's latest arrival against each rank's: ``/`` gives the ratio, ``-`` the excess.
        return f"max {c.by('run')} ({r.work_mean}) {op} {c.on('run')} group_right {r.work_mean}"

    # A rank whose phase times were first recorded over half a rate window ago: the rates read
    # span half a window at least. At a job's start the first rates rest on two scrapes of its
    # first steps, and a rank that took longer over them (on a busy host, the monitoring rank)
    # is no straggler. Read from the records, it holds whatever the real scrape interval. A
    # record exists only while its window holds steps: after a pause longer than the window (a
    # hang the action ended, a restarted attempt) the first steps are judged as a start's.
    half_ms = round(duration_seconds(cfg.rate_window) * 500)
    half = f"{half_ms // 1000}s" if half_ms % 1000 == 0 else f"{half_ms}ms"
    first = f"count_over_time({r.phase_mean}{{{phases}}}[{half}] offset {half})"
    return (
        f"({r.phase_ratio}{{{phases}}} > {ratio:g})\n"
        f"and {c.on('run, rank, phase')}\n"
        f"({r.phase_mean} - {c.on('run, phase')} group_left {r.phase_median}"
        f" > {excess:g})\n"
        f"and {c.on('run, rank')}\n"
        f"(count {c.by('run, rank')} ({first}))\n"
        f"unless {c.on('run, rank')}\n"
        f"(({latest('/')} > {ratio:g})\n"
        f" and {c.on('run, rank')} ({latest('-')} > {excess:g}))"
    )


def compute_straggler(cfg: MixinConfig) -> str:
    """Return the ranks slower than their run's typical rank by compute (cause=compute)."""
    return slower_than_peers(cfg, 'phase="compute"')


def printf_selector(cfg: MixinConfig, metric: str, *labels: str) -> str:
    """Return ``metric{selector, label=%q...}`` for a template's ``printf``, one ``%q`` per label.

    The configured selector goes through printf too: a literal % in it is doubled.
    """
    matchers = [m for m in (cfg.selector.replace("%", "%%"), *(f"{x}=%q" for x in labels)) if m]
    return f"{metric}{{{', '.join(matchers)}}}"


def hang_location(cfg: MixinConfig = DEFAULT, rank_label: str = "rank", window: str = "") -> str:
    """Return a description suffix saying where the alert's rank is stuck, when it is known.

    The culprit of a hang episode publishes ``ddp_hang_location_info`` (exporter.hangs.watcher);
    a template ``query`` looks it up for the alert's run and the rank in label ``rank_label``
    (over ``window`` when the rank is gone) and adds nothing otherwise.
    """
    metric = printf_selector(cfg, catalog.HANG_LOCATION.name, "run", "rank")
    if window:
        metric = f"last_over_time({metric}[{window}])"
    return (
        f"{{{{ with printf `{metric}` $labels.run $labels.{rank_label} | query }}}}"
        "{{ with first . }} Its hang dump says it is at {{ .Labels.file }}:{{ .Labels.line }} "
        "in {{ .Labels.function }} (ddp-exporter hangs DUMP_DIR prints every rank's stack)."
        "{{ end }}{{ end }}"
    )


def hang_network(cfg: MixinConfig = DEFAULT) -> str:
    """Return a description suffix saying what the hang probe found between the nodes, if any.

    While every rank waits inside a collective with nobody behind, the monitoring rank probes
    the links between the nodes and publishes ``ddp_hang_network_info`` (exporter.hangs.probing);
    a template ``query`` reads it for the alert's run and adds nothing otherwise.
    """
    metric = printf_selector(cfg, catalog.HANG_NETWORK.name, "run")
    query = f"max by (finding, node, peer_node) ({metric})"
    return (
        f"{{{{ with printf `{query}` $labels.run | query }}}} The hang probe between the "
        "nodes:{{ range . }}"
        '{{ if eq .Labels.finding "link" }} the link between node {{ .Labels.node }} and node '
        "{{ .Labels.peer_node }} carries no traffic;"
        '{{ else if eq .Labels.finding "node" }} node {{ .Labels.node }} is unreachable on its '
        "backend address;"
        "{{ else }} every pair of nodes reachable and moving data: not the network;{{ end }}"
        "{{ end }}{{ end }}"
    )
