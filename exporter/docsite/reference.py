"""Write the reference pages of the facts the code holds: metrics, settings, mixin fields, alerts.

One home per fact: each page is rendered from the table that defines the fact (the catalog,
:data:`exporter.settings.SETTINGS`, :class:`~exporter.mixin.config.MixinConfig` and its field
comments, the alert rules and dashboard specs), by the same command that writes the rules, and
``ddp-exporter mixin check`` fails when a page is stale. Hand-written pages link here.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

from .. import catalog, settings
from ..mixin.config import DEFAULT, DOMAINS, FAST, MixinConfig
from ..mixin.dashboards import dashboard_specs
from ..mixin.rules import ALERT_NAMES, every_alert
from .markdown import code, md_text, page, table

__all__ = [
    "SERIES_CASES",
    "config_fields",
    "reference_pages",
    "render_alerts",
    "render_config",
    "render_metrics",
    "render_panels",
    "render_settings",
]

#: Where the pages go, relative to the output root (the docs site's reference section).
PAGES = "docs/reference"

#: Rank configurations whose series count the metrics page states: (what, keyword arguments
#: of :func:`exporter.catalog.series_per_rank`).
SERIES_CASES: tuple[tuple[str, dict[str, object]], ...] = (
    ("a DDP rank on CPU, one process group", {}),
    ("the same rank on CUDA (4 GPU memory gauges)", {"gpu": True}),
    ("the monitoring rank of a 1-rank job", {"monitor": True, "world_size": 1}),
    ("the monitoring rank of an 8-rank job", {"monitor": True, "world_size": 8}),
    (
        "the monitoring rank of a 4096-rank job, every peer late (at most `peer_series` peers)",
        {"monitor": True, "world_size": 4096},
    ),
    ("an FSDP2 rank on one group (all-gather and reduce-scatter timed)", {"timed_collectives": 2}),
    (
        "an HSDP rank (2-D mesh: two groups, three kinds of collective timed)",
        {"process_groups": 2, "timed_collectives": 3},
    ),
    (
        "a DDP rank on CPU with 2 named sections, a job deadline and total steps",
        {"sections": 2, "job_deadline": True, "total_steps": True},
    ),
)


def _body(func: object) -> str:
    """Return a docstring without its summary line, as Markdown."""
    doc = inspect.getdoc(func) or ""
    return md_text(doc.partition("\n\n")[2] or doc)


def _labels(metric: catalog.MetricDef) -> str:
    return ", ".join(code(lbl) for lbl in metric.labels) or "–"


def render_metrics() -> str:
    """Return docs/reference/metrics.md: every family, every label, series per rank."""
    families = table(
        ("metric", "type", "labels", "help"),
        ((code(m.name), m.type, _labels(m), md_text(m.help)) for m in catalog.METRICS),
    )
    labels = table(
        ("label", "meaning"),
        ((code(name), md_text(text)) for name, text in catalog.LABEL_HELP.items()),
    )
    counts = table(
        ("rank", "series"),
        ((what, str(catalog.series_per_rank(**kw))) for what, kw in SERIES_CASES),  # type: ignore[arg-type]
    )
    formula = _body(catalog.series_per_rank)
    init = _body(catalog.init_series_per_rank)
    init_counts = table(
        ("rank", "series"),
        (
            ("any rank", str(catalog.init_series_per_rank())),
            (
                "the monitoring rank of a 4096-rank job, nobody arrived",
                str(catalog.init_series_per_rank(monitor=True, world_size=4096)),
            ),
        ),
    )
    return page(
        "Metrics",
        "Every series the exporter publishes, from its catalog (`exporter/catalog.py`), the one "
        "place metric names are defined: the rules, dashboards and runbook are generated from "
        "it too. Every series also carries the labels "
        + ", ".join(code(lbl) for lbl in catalog.BASE_LABELS)
        + ". Histograms add `_bucket`, `_sum` and `_count` series, summaries `_sum` and "
        "`_count`; an info metric's value is always 1.",
        "## Families\n\n" + families,
        "## Labels\n\n" + labels,
        "## Series per rank\n\nComputed by `exporter.catalog.series_per_rank`:\n\n"
        + counts
        + "\n"
        + formula
        + "\n",
        "## While the init watch serves\n\nThe `ddp_init_*` series exist only between "
        "`exporter.watch_init()` and `exporter.instrument()`; the counts above do not change. "
        + init
        + "\n\n"
        + init_counts,
    )


def render_settings() -> str:
    """Return docs/reference/settings.md: every variable, what it accepts, default, meaning."""
    summary = table(
        ("variable", "keyword of `instrument()`", "default"),
        (
            (
                f"[{code(s.name)}](#{s.name.lower()})",
                code(s.keyword) if s.keyword else "–",
                code(s.default_text) if not s.shown_default else md_text(s.shown_default),
            )
            for s in settings.SETTINGS.values()
        ),
    )
    sections = []
    for s in settings.SETTINGS.values():
        keyword = f"`instrument({s.keyword}=...)`" if s.keyword else "none (environment only)"
        sections.append(
            f"### {s.name}\n\n{md_text(s.meaning)}\n\n"
            f"- **Accepts:** {md_text(s.accepted)}\n"
            f"- **Default:** {code(s.default_text) if not s.shown_default else md_text(s.shown_default)}\n"
            f"- **Keyword:** {keyword}\n"
        )
    others = table(
        ("variable", "read for"),
        ((code(name), md_text(text)) for name, text in settings.OTHER_VARIABLES.items()),
    )
    return page(
        "Settings",
        "Every setting of `exporter.instrument()` and `exporter.watch_init()` not passed as a "
        "keyword comes from the environment, so a launcher can configure jobs it does not own. "
        "A keyword wins over the environment, the environment over the default. A variable "
        "holding a value the exporter cannot use never stops training: each process logs one "
        "line naming the variable, the value, what is accepted and the default used instead, "
        "and publishes `ddp_exporter_invalid_setting_info{variable}` (alert "
        "[DDPExporterMisconfigured](../runbook.md#ddpexportermisconfigured)); the same value "
        "passed as a keyword raises `ValueError`. From `exporter/settings.py`.",
        summary,
        "## Variables\n\n" + "\n".join(sections),
        "## Variables read, not owned\n\n" + others,
    )


_COMMENT = re.compile(r"^ {4}#: ?(.*)$")
_FIELD = re.compile(r"^ {4}(\w+): [\w\[\]| ]+ = ")


def config_fields() -> list[tuple[str, str, str]]:
    """Return ``(section, field, comment)`` for every MixinConfig field, from its domains' source.

    The section is the domain's title; the comment, the ``#:`` lines above the field.
    """
    out: list[tuple[str, str, str]] = []
    for domain in DOMAINS:
        own = {f.name for f in dataclasses.fields(domain)}
        comment: list[str] = []
        for line in inspect.getsource(domain).splitlines():
            if m := _COMMENT.match(line):
                comment.append(m.group(1))
            elif (m := _FIELD.match(line)) and m.group(1) in own:
                out.append((domain.TITLE, m.group(1), " ".join(comment)))
                comment = []
            elif not line.strip() or line.lstrip().startswith(("def ", "@")):
                comment = []
    return out


def render_config() -> str:
    """Return docs/reference/mixin-config.md: every MixinConfig field, default, FAST, comment."""
    names = {f.name for f in dataclasses.fields(MixinConfig)}
    documented = config_fields()
    missing = names - {name for _, name, _ in documented}
    if missing:
        raise ValueError(f"MixinConfig fields the page cannot place: {sorted(missing)}")
    sections: dict[str, list[tuple[str, str, str, str]]] = {}
    for section, name, comment in documented:
        default, fast = getattr(DEFAULT, name), getattr(FAST, name)
        sections.setdefault(section, []).append(
            (code(name), code(default), "same" if fast == default else code(fast), md_text(comment))
        )
    body = [
        f"## {section[:1].upper() + section[1:]}\n\n"
        + table(("field", "default", "FAST", "meaning"), rows)
        for section, rows in sections.items()
    ]
    return page(
        "Mixin configuration",
        "Every field of `exporter.mixin.MixinConfig`, which the rules, dashboards, Alertmanager "
        "configuration and deployments are generated from. Change one with `ddp-exporter "
        "mixin generate --out DIR --set FIELD=VALUE` (repeatable), or edit the "
        "`dashboards/mixin.json` a run wrote and pass it back with `--config`; give the same "
        "file to `ddp-exporter top --config` so the table judges with the rules' thresholds. "
        "**FAST** is the variant the tests and drills use (`--fast`): the same expressions "
        "with short windows. A `...` continues the field above.",
        *body,
    )


def render_alerts() -> str:
    """Return docs/reference/alerts.md: every alert, its severities, ``for`` and summary."""
    by_name: dict[str, list] = {}
    for a in every_alert(DEFAULT):
        by_name.setdefault(a.name, []).append(a)
    rows = (
        (
            f"[{name}](../runbook.md#{name.lower()})",
            ", ".join(a.severity for a in by_name[name]),
            ", ".join(code(a.for_) for a in by_name[name]),
            md_text(by_name[name][0].summary),
        )
        for name in ALERT_NAMES
    )
    return page(
        "Alerts",
        "Every alert of the generated rules (`dashboards/prometheus/rules.yml`) with the default "
        "configuration; each name links to its runbook section: what it means, how to confirm "
        "it, what to do, and its expression. `for` durations and thresholds come from the "
        "[mixin configuration](mixin-config.md).",
        table(("alert", "severity", "for", "summary"), rows),
    )


def render_panels() -> str:
    """Return docs/reference/panels.md: every dashboard and its panels."""
    sections = []
    for spec in dashboard_specs(DEFAULT):
        rows = ((md_text(p.title), p.kind, md_text(p.description)) for p in spec.panels)
        sections.append(
            f"## {spec.title}\n\n{md_text(spec.description)} File "
            f"`dashboards/grafana/{spec.stem}.json`, uid `{spec.uid}`.\n\n"
            + table(("panel", "kind", "shows"), rows)
        )
    return page(
        "Dashboard panels",
        "Every panel of the six generated Grafana dashboards, with what it shows. The "
        "[dashboards guide](../dashboards.md) says when to open each, with pictures.",
        *sections,
    )


def reference_pages() -> dict[str, str]:
    """Return ``{repo-relative path: text}`` of the reference pages rendered from tables."""
    return {
        f"{PAGES}/metrics.md": render_metrics(),
        f"{PAGES}/settings.md": render_settings(),
        f"{PAGES}/mixin-config.md": render_config(),
        f"{PAGES}/alerts.md": render_alerts(),
        f"{PAGES}/panels.md": render_panels(),
    }
