"""Build the Grafana dashboards from a thin list of panel specs, rendered with grafanalib.

Each dashboard is a list of :class:`PanelSpec` (title, kind, PromQL targets, unit); one
function turns specs into grafanalib objects and lays them out on the 24-column grid. Every
query filters on the template variables ``run`` and ``rank`` (``rank`` is limited by ``node``
through ``ddp_rank_info``); every datasource reference is ``{"type": "prometheus", "uid":
"${datasource}"}`` and the datasource variable defaults to the provisioned fixed uid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grafanalib import core as g

from exporter import catalog

from .config import DEFAULT, MixinConfig
from .render import dump_json
from .rules import recorded, selector

__all__ = [
    "SCHEMA_VERSION",
    "DashboardSpec",
    "PanelSpec",
    "Target",
    "build",
    "dashboard_specs",
    "render_dashboards",
]

#: Dashboard JSON schema version (Grafana 11.0); Grafana 11 and 12 load it without migration.
SCHEMA_VERSION = 39

#: Datasource reference used by every panel, target and query variable.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

#: Filter on the dashboard variables, for exporter series and recorded series alike.
VARS = 'run=~"$run", rank=~"$rank"'
#: Ranks shown where one series per rank would be too many to read (and to send) at scale.
TOP_RANKS = 10


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    """Describe one panel: what it shows, how, and when it is expected to have data.

    ``needs`` names a condition without which the panel is legitimately empty: ``""`` (always
    has data on a healthy run), ``"gpu"`` (CUDA ranks), ``"alerts"`` (an alert is firing),
    ``"errors"`` (the exporter counted an error), ``"deadline"`` (the job knows its wall-clock
    deadline and total steps), ``"sections"`` (an ``exporter.deadline`` section is running).
    """

    title: str
    targets: tuple[Target, ...]
    kind: str = "timeseries"  # timeseries | bars | bargauge | stat | table
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    needs: str = ""
    min: float | None = None
    max: float | None = None
    thresholds: tuple[tuple[str, float | None], ...] = ()


@dataclass(frozen=True)
class DashboardSpec:
    """Describe one dashboard: file stem, uid, title and panels."""

    stem: str
    uid: str
    title: str
    description: str
    panels: tuple[PanelSpec, ...] = field(default_factory=tuple)


def _s(cfg: MixinConfig, metric: catalog.MetricDef, suffix: str = "", *extra: str) -> str:
    """Return a selector of an exporter series filtered on the dashboard variables."""
    return selector(cfg, metric.name + suffix, VARS, *extra)


def _mean(cfg: MixinConfig, metric: catalog.MetricDef, by: str, *extra: str) -> str:
    """Return the mean per event of a histogram/summary over ``$__rate_interval``."""
    s, c = _s(cfg, metric, "_sum", *extra), _s(cfg, metric, "_count", *extra)
    return (
        f"sum by ({by}) (rate({s}[$__rate_interval]))\n/\n"
        f"sum by ({by}) (rate({c}[$__rate_interval]))"
    )


def _rate(cfg: MixinConfig, metric: catalog.MetricDef, by: str) -> str:
    """Return a per-second rate of a counter over ``$__rate_interval``."""
    return f"sum by ({by}) (rate({_s(cfg, metric)}[$__rate_interval]))"


def _rec(name: str, *extra: str) -> str:
    """Return a recorded series filtered on the dashboard variables."""
    return f"{name}{{{', '.join((VARS, *extra))}}}"


def _up(cfg: MixinConfig) -> str:
    """Return the ``up`` selector of the exporter's scrape targets (labels from file_sd)."""
    return selector(cfg, "up", f'job="{cfg.job}"', VARS)


def dashboard_specs(cfg: MixinConfig = DEFAULT) -> tuple[DashboardSpec, ...]:
    """Return the five dashboards as specs."""
    r = recorded(cfg)
    ranks = "rank {{rank}}"
    phases = "|".join(catalog.PHASES)
    phase_sel = f'phase=~"{phases}"'
    overview = DashboardSpec(
        "overview",
        "ddp-overview",
        "DDP / Overview",
        "Job health, throughput, step time and the straggler score per rank.",
        (
            PanelSpec(
                "Targets up",
                (Target(f"sum by (run) ({_up(cfg)})", "{{run}}"),),
                kind="stat",
                width=4,
                height=5,
                description="Scrape targets (ranks) whose endpoint answers.",
            ),
            PanelSpec(
                "Targets down",
                (Target(f"sum by (run) (1 - {_up(cfg)})", "{{run}}"),),
                kind="stat",
                width=4,
                height=5,
                thresholds=(("green", None), ("red", 1)),
                description="Scrape targets whose endpoint does not answer (dead or unreachable).",
            ),
            PanelSpec(
                "Alerts firing",
                (Target('count(ALERTS{alertstate="firing", run=~"$run"}) or vector(0)', "firing"),),
                kind="stat",
                width=4,
                height=5,
                thresholds=(("green", None), ("red", 1)),
            ),
            PanelSpec(
                "Steps/s (slowest rank)",
                (Target(f"min by (run) ({_rate(cfg, catalog.STEPS, 'run, rank')})", "{{run}}"),),
                kind="stat",
                unit="ops",
                width=4,
                height=5,
            ),
            PanelSpec(
                "Ranks reporting",
                (Target(f"count by (run) ({_s(cfg, catalog.RANK_INFO)})", "{{run}}"),),
                kind="stat",
                width=4,
                height=5,
            ),
            PanelSpec(
                "Median step time",
                (
                    Target(
                        "quantile by (run) (0.5, "
                        f"{_mean(cfg, catalog.STEP_DURATION, 'run, rank')})",
                        "{{run}}",
                    ),
                ),
                kind="stat",
                unit="s",
                width=4,
                height=5,
            ),
            PanelSpec(
                "Steps/s per rank",
                (Target(_rate(cfg, catalog.STEPS, "run, rank"), ranks),),
                unit="ops",
            ),
            PanelSpec(
                "Step time per rank (mean)",
                (Target(_mean(cfg, catalog.STEP_DURATION, "run, rank"), ranks),),
                unit="s",
            ),
            PanelSpec(
                "Straggler score per rank",
                (Target(_rec(r.straggler_score), ranks),),
                kind="bargauge",
                min=0,
                max=max(3.0, cfg.straggler_ratio * 2),
                thresholds=(("green", None), ("yellow", 1.2), ("red", cfg.straggler_ratio)),
                description=(
                    "Compute+data time per step of the rank over the run's median rank "
                    f"({cfg.rate_window} window). 1 = typical; above {cfg.straggler_ratio:g} "
                    "the rank holds the job back. Never judged by collective latency: the "
                    "straggler's is the shortest."
                ),
            ),
            PanelSpec(
                "Step time p90 per rank",
                (
                    # Recorded: a range query of per-rank quantiles at 4096 ranks took > 1 s.
                    Target(_rec(r.step_p90), ranks),
                ),
                unit="s",
            ),
            PanelSpec(
                "Alerts firing (list)",
                (
                    Target(
                        "max by (alertname, severity, run, rank, cause, role, pg) "
                        '(ALERTS{alertstate="firing", run=~"$run"})',
                        "{{alertname}} {{severity}} rank {{rank}}",
                    ),
                ),
                kind="table",
                width=24,
                needs="alerts",
            ),
            PanelSpec(
                "Time to finish vs deadline",
                (
                    Target(
                        f'{r.projected_finish_run}{{run=~"$run"}} - time()',
                        "projected time to finish {{run}}",
                    ),
                    Target(
                        f"min by (run) ({_s(cfg, catalog.JOB_DEADLINE)}) - time()",
                        "time left to deadline {{run}}",
                    ),
                ),
                unit="s",
                width=24,
                needs="deadline",
                description=(
                    "Projected time to finish (steps left over the step rate of the last "
                    f"{cfg.eta_window}) against the time left to the job's wall-clock deadline "
                    "(SLURM_JOB_END_TIME or DDP_EXPORTER_JOB_DEADLINE). The job fits while the "
                    "projection stays below the deadline line by the margin "
                    f"({cfg.job_deadline_margin_seconds:g}s); DDPJobWillMissDeadline fires "
                    "otherwise. Needs instrument(total_steps=...) or epochs=..."
                ),
            ),
        ),
    )
    stragglers = DashboardSpec(
        "stragglers",
        "ddp-stragglers",
        "DDP / Stragglers",
        "Where each rank's step time goes. The straggler has the tallest compute or data bar; "
        "the ranks waiting for it have the tallest comm_wait bar.",
        (
            PanelSpec(
                f"Phase time per step, {TOP_RANKS} most loaded ranks",
                (
                    # Recorded phases of the ranks with the highest straggler score only: all
                    # 4 x 4096 series were > 1 s to return and unreadable as a stack.
                    Target(
                        f"{_rec(r.phase_mean, phase_sel)}\n"
                        f"and on (run, rank)\ntopk by (run) ({TOP_RANKS}, "
                        f"{_rec(r.straggler_score)})",
                        "rank {{rank}} {{phase}}",
                    ),
                ),
                kind="bars",
                unit="s",
                width=24,
                description=(
                    "Where the step goes on the ranks with the most compute+data time per step "
                    "relative to the run's median (the straggler score)."
                ),
            ),
            PanelSpec(
                "Compute per step vs run median",
                (
                    Target(_rec(r.phase_mean, 'phase="compute"'), ranks),
                    Target(f'{r.phase_median}{{run=~"$run", phase="compute"}}', "median {{run}}"),
                ),
                unit="s",
            ),
            PanelSpec(
                "Data wait per step vs run median",
                (
                    Target(_rec(r.phase_mean, 'phase="data"'), ranks),
                    Target(f'{r.phase_median}{{run=~"$run", phase="data"}}', "median {{run}}"),
                ),
                unit="s",
            ),
            PanelSpec(
                "Phase share of the step, by rank",
                (Target(_rec(r.phase_share), "rank {{rank}} {{phase}}"),),
                kind="bargauge",
                unit="percentunit",
                min=0,
                max=1,
                thresholds=(("green", None), ("yellow", cfg.input_bound_share)),
            ),
            PanelSpec(
                "Compute/data ratio to the run median",
                (Target(_rec(r.phase_ratio, 'phase=~"compute|data"'), "rank {{rank}} {{phase}}"),),
                description=f"Alerts above {cfg.straggler_ratio:g} (DDPRankStraggler).",
            ),
            PanelSpec(
                "Comm wait per step (waiting for a straggler or the network)",
                (
                    Target(
                        _mean(cfg, catalog.STEP_PHASE, "run, rank", 'phase="comm_wait"'),
                        ranks,
                    ),
                ),
                unit="s",
                width=24,
            ),
        ),
    )
    coll_by = "run, rank, op, pg"
    collectives = DashboardSpec(
        "collectives",
        "ddp-collectives",
        "DDP / Collectives",
        "Gradient-bucket collectives: latency, bytes, in-flight age against the timeout, and "
        "the sequence-number lag that names a hung rank.",
        (
            PanelSpec(
                "Collective latency (mean) per rank and pg",
                (
                    Target(
                        _mean(cfg, catalog.COLLECTIVE_DURATION, coll_by),
                        "rank {{rank}} {{op}} pg {{pg}}",
                    ),
                ),
                unit="s",
                description="A straggler shows the SHORTEST latency: its peers wait for it.",
            ),
            PanelSpec(
                "Collective latency p90 per rank and pg",
                (Target(_rec(r.coll_p90_rank), "rank {{rank}} {{op}} pg {{pg}}"),),
                unit="s",
            ),
            PanelSpec(
                "Collective bytes/s per rank and pg",
                (Target(_rate(cfg, catalog.COLLECTIVE_BYTES, coll_by), "rank {{rank}} pg {{pg}}"),),
                unit="Bps",
            ),
            PanelSpec(
                "In-flight age vs timeout budget",
                (
                    Target(
                        f"max by (run, rank, pg) ({_s(cfg, catalog.INFLIGHT_AGE)})",
                        "age rank {{rank}} pg {{pg}}",
                    ),
                    Target(
                        f"max by (run, pg) ({_s(cfg, catalog.COLLECTIVE_TIMEOUT)})",
                        "timeout pg {{pg}}",
                    ),
                ),
                unit="s",
            ),
            PanelSpec(
                "In-flight age / timeout",
                (Target(_rec(r.inflight_ratio_rank), "rank {{rank}} pg {{pg}}"),),
                unit="percentunit",
                min=0,
                max=1,
                thresholds=(
                    ("green", None),
                    ("orange", cfg.timeout_warning_ratio),
                    ("red", cfg.timeout_critical_ratio),
                ),
            ),
            PanelSpec(
                "Sequence-number lag behind the run's max",
                (Target(_rec(r.seq_behind), "rank {{rank}} pg {{pg}}"),),
                description="Collectives a rank has not entered yet. A hung rank's lag stays "
                "above 0 while the others' in-flight age grows.",
            ),
            PanelSpec(
                "Last enqueued / completed sequence number",
                (
                    Target(
                        f"max by (run, rank, pg) ({_s(cfg, catalog.LAST_ENQUEUED_SEQ)})",
                        "enqueued rank {{rank}} pg {{pg}}",
                    ),
                    Target(
                        f"max by (run, rank, pg) ({_s(cfg, catalog.LAST_COMPLETED_SEQ)})",
                        "completed rank {{rank}} pg {{pg}}",
                    ),
                ),
                width=24,
            ),
        ),
    )
    mem = "run, rank"
    memory = DashboardSpec(
        "memory",
        "ddp-memory",
        "DDP / Memory",
        "GPU memory (allocated, reserved, peak against total) and host resident memory per rank.",
        (
            PanelSpec(
                "GPU memory per rank",
                tuple(
                    Target(f"max by ({mem}) ({_s(cfg, m)})", f"{label} rank {{{{rank}}}}")
                    for m, label in (
                        (catalog.GPU_MEM_ALLOCATED, "allocated"),
                        (catalog.GPU_MEM_RESERVED, "reserved"),
                        (catalog.GPU_MEM_PEAK, "peak"),
                        (catalog.GPU_MEM_TOTAL, "total"),
                    )
                ),
                unit="bytes",
                needs="gpu",
            ),
            PanelSpec(
                "GPU reserved / total",
                (Target(_rec(r.gpu_reserved_ratio), ranks),),
                kind="bargauge",
                unit="percentunit",
                min=0,
                max=1,
                thresholds=(("green", None), ("orange", 0.8), ("red", cfg.gpu_memory_ratio)),
                needs="gpu",
            ),
            PanelSpec(
                "Host resident memory per rank",
                (Target(f"max by ({mem}) ({_s(cfg, catalog.HOST_MEM_RESIDENT)})", ranks),),
                unit="bytes",
                width=24,
            ),
        ),
    )
    peer = selector(cfg, catalog.PEER_HEARTBEAT_AGE.name, 'run=~"$run", peer_rank=~"$rank"')
    liveness = DashboardSpec(
        "liveness",
        "ddp-liveness",
        "DDP / Liveness",
        "Is every rank alive and progressing? Heartbeat ages, the monitoring rank's view of "
        "its peers (which survives a dead endpoint), and scrape health.",
        (
            PanelSpec(
                "Heartbeat age per rank (time since last progress)",
                (Target(f"time() - max by (run, rank) ({_s(cfg, catalog.HEARTBEAT)})", ranks),),
                unit="s",
            ),
            PanelSpec(
                "Peer heartbeat age (seen by the monitoring rank)",
                (
                    Target(
                        f"max by (run, peer_rank) ({peer})",
                        "rank {{peer_rank}}",
                    ),
                ),
                unit="s",
                thresholds=(("green", None), ("red", cfg.heartbeat_stale_seconds)),
                description=(
                    "Every peer in jobs of up to DDP_EXPORTER_PEER_SERIES "
                    f"({catalog.DEFAULT_PEER_SERIES}) ranks; in larger jobs only late peers "
                    "(silent for over three heartbeat intervals), so an empty panel is healthy."
                ),
            ),
            PanelSpec(
                "Scrape up per rank",
                (Target(f"max by (run, rank) ({_up(cfg)})", ranks),),
                min=0,
                max=1,
            ),
            PanelSpec(
                "Exporter errors/s",
                (
                    # Recorded with only the places that have errors (32k zero series at 4096).
                    Target(_rec(r.errors_rate), "rank {{rank}} {{where}}"),
                ),
                unit="ops",
                needs="errors",
            ),
            PanelSpec(
                "Rank info",
                (Target(_s(cfg, catalog.RANK_INFO), ranks),),
                kind="table",
                width=24,
            ),
            PanelSpec(
                "Named sections: running time vs deadline",
                (
                    Target(
                        f"time() - {_s(cfg, catalog.SECTION_STARTED)}",
                        "rank {{rank}} {{section}} running",
                    ),
                    Target(
                        f"{_s(cfg, catalog.SECTION_DEADLINE)}\nand on (run, rank, section)\n"
                        f"{_s(cfg, catalog.SECTION_STARTED)}",
                        "rank {{rank}} {{section}} deadline",
                    ),
                ),
                unit="s",
                width=24,
                needs="sections",
                description=(
                    "How long each running exporter.deadline() section has been running, "
                    "against its deadline; DDPSectionOverdue fires when a line crosses its "
                    "deadline. Empty while no section runs."
                ),
            ),
        ),
    )
    return (overview, stragglers, collectives, memory, liveness)


def _thresholds(spec: PanelSpec) -> dict[str, Any]:
    """Return a Grafana thresholds object (first step has value null)."""
    steps = spec.thresholds or (("green", None),)
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


def _panel(spec: PanelSpec, pos: g.GridPos, panel_id: int) -> g.Panel:
    """Return the grafanalib panel of ``spec`` at ``pos``."""
    instant = spec.kind in ("bargauge", "table")
    targets = [
        g.Target(
            expr=t.expr,
            legendFormat=t.legend,
            refId=chr(ord("A") + i),
            datasource=DATASOURCE,
            instant=instant,
            format="table" if spec.kind == "table" else "time_series",
            intervalFactor=1,
        )
        for i, t in enumerate(spec.targets)
    ]
    defaults: dict[str, Any] = {
        "unit": spec.unit,
        "thresholds": _thresholds(spec),
        "color": {"mode": "thresholds" if spec.kind in ("stat", "bargauge") else "palette-classic"},
    }
    if spec.min is not None:
        defaults["min"] = spec.min
    if spec.max is not None:
        defaults["max"] = spec.max
    common: dict[str, Any] = {
        "title": spec.title,
        "description": spec.description or None,
        "dataSource": DATASOURCE,
        "targets": targets,
        "gridPos": pos,
        "id": panel_id,
        "maxDataPoints": None,
    }
    extra: dict[str, Any] = {"fieldConfig": {"defaults": defaults}}
    if spec.kind in ("timeseries", "bars"):
        return g.TimeSeries(
            **common,
            unit=spec.unit,
            drawStyle="bars" if spec.kind == "bars" else "line",
            fillOpacity=80 if spec.kind == "bars" else 10,
            stacking={"mode": "normal", "group": "A"} if spec.kind == "bars" else {},
            legendDisplayMode="table",
            legendPlacement="right" if spec.width == 24 else "bottom",
            legendCalcs=["lastNotNull", "max"],
            tooltipMode="multi",
            tooltipSort="desc",
            extraJson=extra,
        )
    if spec.kind == "stat":
        return g.Stat(
            **common,
            format=spec.unit,
            reduceCalc="lastNotNull",
            graphMode="area",
            noValue="0",
            extraJson=extra,
        )
    if spec.kind == "bargauge":
        extra["options"] = {
            "displayMode": "gradient",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showUnfilled": True,
            "minVizHeight": 10,
            "minVizWidth": 0,
            "valueMode": "color",
            "namePlacement": "auto",
            "sizing": "auto",
        }
        return g.BarGauge(
            **common,
            format=spec.unit,
            min=spec.min if spec.min is not None else 0,
            max=spec.max if spec.max is not None else 100,
            displayMode=g.GAUGE_DISPLAY_MODE_GRADIENT,
            thresholds=[],
            extraJson=extra,
        )
    if spec.kind == "table":
        extra["transformations"] = [
            {"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True}}}
        ]
        return g.Table(**common, unit=spec.unit, extraJson=extra)
    raise ValueError(f"unknown panel kind {spec.kind!r}")


def _layout(specs: tuple[PanelSpec, ...]) -> list[g.GridPos]:
    """Return grid positions filling rows of 24 columns left to right."""
    out, x, y, row_h = [], 0, 0, 0
    for spec in specs:
        if x + spec.width > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(g.GridPos(h=spec.height, w=spec.width, x=x, y=y))
        x += spec.width
        row_h = max(row_h, spec.height)
    return out


def _variables(cfg: MixinConfig) -> list[g.Template]:
    """Return the template variables: datasource, run, node, rank."""
    info = catalog.RANK_INFO.name
    extra = f"{cfg.selector}, " if cfg.selector else ""

    def query_var(name: str, label: str, query: str) -> g.Template:
        return g.Template(
            name=name,
            label=label,
            query=query,
            dataSource=DATASOURCE,
            includeAll=True,
            multi=True,
            allValue=".*",
            default="$__all",
            refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
        )

    datasource = g.Template(
        name="datasource",
        label="Data source",
        query="prometheus",
        type="datasource",
        default=cfg.datasource_uid,
    )
    return [
        datasource,
        query_var("run", "Run", f"label_values({selector(cfg, info)}, run)"),
        query_var("node", "Node", f'label_values({info}{{{extra}run=~"$run"}}, node)'),
        query_var(
            "rank", "Rank", f'label_values({info}{{{extra}run=~"$run", node=~"$node"}}, rank)'
        ),
    ]


def build(spec: DashboardSpec, cfg: MixinConfig = DEFAULT) -> dict[str, Any]:
    """Return the Grafana JSON model of one dashboard spec."""
    panels = [
        _panel(p, pos, i + 1) for i, (p, pos) in enumerate(zip(spec.panels, _layout(spec.panels)))
    ]
    dash = g.Dashboard(
        title=spec.title,
        uid=spec.uid,
        description=spec.description,
        tags=["ddp-exporter"],
        timezone="browser",
        refresh=cfg.dashboard_refresh,
        time=g.Time("now-30m", "now"),
        schemaVersion=SCHEMA_VERSION,
        sharedCrosshair=True,
        templating=g.Templating(list=_variables(cfg)),
        links=[
            g.DashboardLink(
                title="DDP dashboards",
                type="dashboards",
                tags=["ddp-exporter"],
                asDropdown=True,
                includeVars=True,
                keepTime=True,
            )
        ],
        panels=panels,
    ).auto_panel_ids()
    data = json_roundtrip(dash)
    data["id"] = None
    data["version"] = 1
    for var in data["templating"]["list"]:
        if var["includeAll"]:  # Grafana's shape of a multi-value "All" selection
            var["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return data


def json_roundtrip(obj: Any) -> dict[str, Any]:
    """Return grafanalib objects as plain JSON-compatible data."""
    import json

    from grafanalib._gen import DashboardEncoder

    return json.loads(json.dumps(obj, cls=DashboardEncoder))


def render_dashboards(cfg: MixinConfig = DEFAULT) -> dict[str, str]:
    """Return ``{file name: JSON text}`` of every dashboard."""
    return {f"{d.stem}.json": dump_json(build(d, cfg)) for d in dashboard_specs(cfg)}
