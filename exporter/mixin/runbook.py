"""Write the runbook: per alert, what it means, how to confirm it, what to do."""

from __future__ import annotations

import dataclasses

from .. import settings
from .config import DEFAULT, MixinConfig
from .prose import spoken_duration
from .render import header
from .rules import ALERT_NAMES, Alert, every_alert

__all__ = ["render_runbook"]


def _intro(cfg: MixinConfig) -> str:
    """Return the runbook's opening: the rules of thumb, in ``cfg``'s and the settings' numbers."""
    code, window = settings.DEFAULT_ABORT_EXIT_CODE, spoken_duration(cfg.hang_abort_window)
    limit, give_up = settings.DEFAULT_ABORT_LIMIT, settings.DEFAULT_GIVE_UP_EXIT_CODE
    return f"""\
# ddp-exporter runbook

One section per alert of the ddp-exporter monitoring mixin. Every alert carries the label `run`,
a `severity` and a `runbook_url` pointing here; an alert about one rank also carries `rank` (the
rank to look at), while a condition of the whole run (stalled, slower, killed, stuck with nobody
behind, will miss its deadline) is one alert per run without it. The fleet alert
(DDPSuspectNode) is about a node across runs: it carries `node`, no run and no rank.
Dashboards: **DDP / Overview**, **DDP / Stragglers**, **DDP / Collectives**, **DDP / Memory**,
**DDP / Liveness**, **DDP / Fleet** (provisioned by `docker compose up`).

These rules of thumb hold throughout:

- A straggler shows the **shortest** collective latency: the healthy ranks wait for it inside
  the allreduce. Blame by compute and data time per step, never by collective latency.
- A hung rank is the one whose collective **sequence number stops advancing**
  (`ddp_collective_last_enqueued_seq` behind the run's maximum); its peers show a growing
  in-flight age.
- A job has edges. A rank inside a declared section (`with exporter.deadline("checkpoint",
  seconds=600):`) within its deadline is not hung, nor are the ranks waiting for it, and the run
  is not stalled; past the deadline **DDPSectionOverdue** names it and the hang alerts apply
  again. A rank that ended cleanly (`ddp_finished_timestamp_seconds`) is not down; a run whose
  ranks all vanish without a clean end is one **DDPJobKilled**. A restarted attempt continues
  the same `run` (`ddp_rank_info{{attempt}}`).
- A hang can end the run (`instrument(on_hang="abort")`): every rank exits with code {code} for the
  launcher to restart the job from its last checkpoint, and **DDPHangAborted** names the
  culprit, its node and where it was stuck; the run then has {window} (`hang_abort_window`)
  to come back before it counts as killed. After {limit} aborts in a row without progress the last
  one exits {give_up} ("do not requeue"), the action stops and **DDPRestartLoop** names every
  attempt's culprit.

- A node, not only a rank: every accusation above (straggler, hung rank, rank down) is also
  kept per node for days. **DDPSuspectNode** names a node blamed in several of its last runs
  while most of the other nodes of each run were not (definition in its section below); one
  slow job, a slowdown of every rank, a data stall common to all ranks or a node that hosts many
  jobs never makes a node suspect. `ddp-exporter nodes --prometheus URL` ranks nodes by
  evidence.

{_whose_numbers(cfg)}
"""


def _whose_numbers(cfg: MixinConfig) -> str:
    """Return the sentence that says which configuration the numbers below are from."""
    if cfg == DEFAULT:
        return (
            "Thresholds and durations below are those of the committed configuration; regenerate "
            "with your\nown settings (`ddp-exporter mixin generate --out DIR --set FIELD=VALUE`) "
            "to change them."
        )
    return (
        "Thresholds and durations below are those of the configuration this runbook was "
        "generated\nwith (`dashboards/mixin.json`); regenerate (`ddp-exporter mixin generate "
        "--out DIR --set\nFIELD=VALUE`) to change them."
    )


def _section(group: list[Alert]) -> str:
    """Return the markdown section of one alert name (one or more severities)."""
    first = group[0]
    sev = ", ".join(f"`{a.severity}`" for a in group)
    fors = ", ".join(f"`{a.for_}`" for a in group)
    lines = [
        f"## {first.name}",
        "",
        f"**Severity:** {sev} · **For:** {fors} · **Summary:** {first.summary}",
        "",
        "### What it means",
        "",
        first.meaning,
        "",
        "### How to confirm",
        "",
        first.confirm,
        "",
        "### What to do",
        "",
        first.action,
        "",
        "### Expression",
        "",
    ]
    for a in group:
        lines += [f"`{a.severity}`:", "", "```promql", a.expr, "```", ""]
    return "\n".join(lines)


def render_runbook(cfg: MixinConfig = DEFAULT) -> str:
    """Return docs/runbook.md text; each alert's section anchor is its lower-cased name.

    Each expression is shown as a person reads it: without the cluster label, which every
    clause of the rule file carries and which one Prometheus per cluster never sees.
    """
    by_name: dict[str, list[Alert]] = {}
    for a in every_alert(dataclasses.replace(cfg, cluster_label="")):
        by_name.setdefault(a.name, []).append(a)
    toc = "\n".join(f"- [{n}](#{n.lower()})" for n in ALERT_NAMES)
    body = "\n".join(_section(by_name[n]) for n in ALERT_NAMES)
    return header("<!--").rstrip("\n") + " -->\n\n" + _intro(cfg) + "\n" + toc + "\n\n" + body
