"""Build DDPExporterMisconfigured: a variable of the exporter holds a value it cannot use.

A bad monitoring setting never costs a run (:mod:`exporter.settings`): the rank logs one line and
goes on with the default. This alert makes the mistake visible where people look, one alert per
run and variable, counting the ranks that report it.
"""

from __future__ import annotations

from ... import catalog
from ..alert import Alert, selector
from ..cluster import clauses
from ..config import DEFAULT, MixinConfig

__all__ = ["misconfigured_alert"]


def misconfigured_alert(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPExporterMisconfigured for ``cfg``."""
    invalid = selector(cfg, catalog.INVALID_SETTING.name)
    return Alert(
        "DDPExporterMisconfigured",
        "warning",
        f"count {clauses(cfg).by('run, variable')} ({invalid})",
        cfg.misconfigured_for,
        "A variable of the exporter holds a value it cannot use; its default is used instead.",
        (
            "{{ $labels.variable }} holds a value the exporter cannot use on {{ $value }} "
            "rank(s) of run {{ $labels.run }}: they train on with its default instead, and each "
            "one's log names the value, what is accepted and the default used."
        ),
        "An environment variable of the exporter (`DDP_EXPORTER_*`) holds a value it cannot "
        "use: a typo such as `DDP_EXPORTER_PORT=notaport`, `DDP_EXPORTER_ON_HANG=explode` or "
        "`DDP_EXPORTER_COMM_TIMING=sometimes`, or a dump folder the ranks cannot write. A "
        "monitoring setting never stops training, so the run goes on with the default; but "
        "the monitoring is not what was asked for: a hang action left off, metrics on another "
        "port than the one Prometheus scrapes, hang dumps written elsewhere (the log line says "
        "where) or lost.",
        "The log of each named rank has one line per such variable, starting "
        "`ddp-exporter: DDP_EXPORTER_...: expected`; it names the value found, what is accepted "
        "and the default used. Query `ddp_exporter_invalid_setting_info` for the ranks that "
        "report it.",
        "Fix the variable in the job's launch script, Slurm batch file or pod spec (the log "
        "line says what it accepts; the settings reference, docs/reference/settings.md, lists every variable), "
        "then restart the job from its next checkpoint. Nothing is lost meanwhile but what the "
        "default does differently.",
        scope="run",
    )
