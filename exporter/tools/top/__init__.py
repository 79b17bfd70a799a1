"""Show every rank of a run in one terminal table, the outlier highlighted with its reason.

Reads the ranks' own endpoints (no Prometheus or Grafana needed: useful over ssh during an
incident), or one run's series from a Prometheus server. Per-step figures cover the last
rate window (from Prometheus) or, from endpoints, the interval since the newest read at least
5 s old (:class:`.history.ReadHistory`; since the first read until then). Sorts by badness and
shows the worst N, so thousands of ranks fit.

Verdicts follow the same definitions as the generated alerts: a straggler by compute or data
time per step (:class:`~exporter.mixin.config.MixinConfig` thresholds: pass the config the rules
were generated with), a hang by :mod:`exporter.hangs.definition`. Every accusation (DOWN, HUNG,
straggler) must hold in two consecutive reads, as an alert must hold for its ``for`` duration:
one slow scrape or one odd interval accuses nobody. A straggler's pace must hold over two
intervals that do not overlap: reads a rate window apart (from Prometheus, the first read looks
one window back; from endpoints, every read over 5 s holds it), since a burst of jitter shows
in every window that holds it.

The job's edges accuse nobody either: a rank inside a declared section within its deadline
(``exporter.deadline``) and the ranks waiting for it get a note, not a verdict; a rank that
ended cleanly (``ddp_finished_timestamp_seconds`` in its last read) is ``finished``, not DOWN.
Once a section ends, the wait of the ranks it held up counts from its end, as the hang watcher
counts it: the section's rank has a stall threshold to reach the collective before it is HUNG.

The package: :mod:`.rows` (what one rank says), :mod:`.fetch` (endpoints or Prometheus),
:mod:`.diagnose` (the verdicts), :mod:`.history` (endpoint reads over a window),
:mod:`.render` (the table), :mod:`.command` (the CLI).
"""

from __future__ import annotations

from .command import add_parser, run
from .diagnose import ACCUSATIONS, accuses, diagnose
from .fetch import fetch, fetch_prometheus, prometheus_baseline
from .history import ReadHistory
from .render import render, restart_line
from .rows import RankRow

__all__ = [
    "ACCUSATIONS",
    "RankRow",
    "ReadHistory",
    "accuses",
    "add_parser",
    "diagnose",
    "fetch",
    "fetch_prometheus",
    "prometheus_baseline",
    "render",
    "restart_line",
    "run",
]
