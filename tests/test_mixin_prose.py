"""Test that the generated prose states the numbers of its own configuration.

The rules' descriptions, the runbook and the panels' descriptions restate thresholds, windows,
exit codes and limits in sentences. Each number must come from the configuration or from the
exporter's settings defaults: generated with other numbers, the text must say those, never
contradict its own alerts.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from exporter import settings
from exporter.mixin.__main__ import main
from exporter.mixin.alerts import hang_action
from exporter.mixin.config import DEFAULT, MixinConfig
from exporter.mixin.dashboards import TOP_RANKS, dashboard_specs
from exporter.mixin.dashboards import fleet as fleet_dashboard
from exporter.mixin.dashboards import liveness as liveness_dashboard
from exporter.mixin.rules import every_alert
from exporter.mixin.runbook import render_runbook

pytestmark = pytest.mark.unit

#: Every number of DEFAULT changed to one that its prose never states (no default is among
#: these), so that a number the text hard-codes shows up unchanged.
SHIFTED = dataclasses.replace(
    DEFAULT,
    rate_window="17m",
    latency_window="19m",
    baseline_window="43m",
    hang_abort_window="23m",
    restart_loop_window="47h",
    straggler_ratio=1.7,
    straggler_min_excess_seconds=0.031,
    link_rtt_ratio=6.5,
    link_min_rtt_seconds=0.013,
    link_comm_share=0.37,
    input_bound_share=0.41,
    stall_latency_factor=27.0,
    stall_min_seconds=13.0,
    timeout_warning_ratio=0.53,
    timeout_critical_ratio=0.87,
    heartbeat_stale_seconds=97.0,
    gpu_memory_ratio=0.93,
    gpu_clock_ratio=0.81,
    gpu_error_window="29m",
    throughput_drop_ratio=0.57,
    init_stuck_seconds=433.0,
    straggler_for="6m",
    input_bound_for="11m",
    stalled_for="4m",
    timeout_for="14s",
    rank_down_for="8m",
    training_stalled_for="9m",
    training_startup_for="47m",
    gpu_memory_for="12m",
    throughput_for="16m",
    init_stuck_for="18m",
    version_skew_for="21m",
    section_overdue_for="22s",
    eta_window="26m",
    job_deadline_margin_seconds=2417.0,
    job_deadline_for="28m",
    misconfigured_for="29m",
    fleet_window="31d",
    fleet_runs=34,
    fleet_blamed_runs=33,
    fleet_interval="32m",
    fleet_carry="71m",
    suspect_node_for="36m",
    shard_down_for="38m",
    ranks_per_pod=4,
    federate_job="federate",
    goodput_window="39m",
    goodput_long_window="57m",
    goodput_node_window="51m",
    goodput_min_ettr=0.71,
    goodput_min_evidence=0.37,
    goodput_for="27m",
    scrape_interval="7s",
)

#: The exporter's defaults the prose states, changed the same way.
SHIFTED_SETTINGS = {
    "DEFAULT_ABORT_EXIT_CODE": 76,
    "DEFAULT_GIVE_UP_EXIT_CODE": 78,
    "DEFAULT_ABORT_LIMIT": 4,
    "DEFAULT_ABORT_PROGRESS_STEPS": 53,
    "DEFAULT_ABORT_AFTER_S": 24.0,
    "DEFAULT_PEER_SERIES": 57,
}

#: Where the prose states a number whatever the configuration (a pattern, and why).
CONSTANT = {
    r"`ddp_init_peer_arrived\{peer_rank\}` \(0 = not arrived\)": "a value of a series",
    r"seconds=600\)": "an example exporter.deadline() call",
    r"http://SHARD:9090/": "Prometheus's port in an example command",
    r"\b1 = typical|capped at 1 ": "the straggler score's scale",
    r": 1 when Prometheus scraped the rank's endpoint, 0 when": "the values of up",
    r"lag stays above 0 ": "a lag's value: none",
    r"100 % = as fast as the typical rank, 50 % = half": "the relative speed's scale",
    r"\b90th percentile": "the quantile the p90 records take (and the panel's title says)",
    rf"\b{TOP_RANKS} (slowest|most loaded) ranks|slowest {TOP_RANKS} ranks": "TOP_RANKS, in the query",
    rf"\(top {fleet_dashboard.TOP_NODES}\)": "TOP_NODES, in the query",
    r"\(lt \$value 1\.0\)": "a round-trip ratio below 1: the store's own node, in a template",
    r"quantile\(0\.5, ": "the run's median clock, in a template",
    r"\(13, 31, 43: ": "NVIDIA's Xid numbers of a job's own kernel faults",
}


def _constants_out(text: str) -> str:
    """Return ``text`` without the places :data:`CONSTANT` names."""
    for pattern in CONSTANT:
        text = re.sub(pattern, "", text)
    return text


_NUMBER = re.compile(r"(?<![\w.%])\d+(?:\.\d+)?")


def _prose(cfg: MixinConfig) -> str:
    """Return every sentence generated for ``cfg``: alerts, the runbook's opening, panels."""
    parts = [
        text
        for a in every_alert(cfg)
        for text in (a.summary, a.description, a.meaning, a.confirm, a.action)
    ]
    parts.append(render_runbook(cfg).split("\n## ")[0])
    for dash in dashboard_specs(cfg):
        parts += [dash.description, *(f"{p.title}: {p.description}" for p in dash.panels)]
    return "\n".join(parts)


def _shift_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Change the settings defaults the prose states, and the monitoring rank's."""
    for name, value in SHIFTED_SETTINGS.items():
        monkeypatch.setattr(settings, name, value)
    monitor = settings.SETTINGS[settings.MONITOR_RANK]
    monkeypatch.setitem(
        settings.SETTINGS, settings.MONITOR_RANK, dataclasses.replace(monitor, default=9)
    )
    monkeypatch.setattr(hang_action, "TORCH_TIMEOUT_MINUTES", (11, 39))


@pytest.fixture
def shifted_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the test with the settings defaults changed (:func:`_shift_settings`)."""
    _shift_settings(monkeypatch)


def test_no_number_of_the_default_prose_survives_other_numbers(monkeypatch) -> None:
    default_numbers = set(_NUMBER.findall(_constants_out(_prose(DEFAULT))))
    _shift_settings(monkeypatch)
    shifted = _constants_out(_prose(SHIFTED))
    kept = sorted(set(_NUMBER.findall(shifted)) & default_numbers, key=float)
    where = {n: re.findall(rf".{{0,60}}(?<![\w.%]){n}(?![\d.]).{{0,20}}", shifted) for n in kept}
    assert not kept, f"hard-coded in the prose (format them from the config or settings): {where}"
    for name, value in SHIFTED_SETTINGS.items():
        assert f"{value:g}" in shifted, name


def test_the_shifted_prose_states_its_own_numbers(shifted_settings) -> None:
    runbook = render_runbook(SHIFTED).split("\n## ")[0]
    assert "every rank exits with code 76" in runbook
    assert "the run then has 23 minutes (`hang_abort_window`)" in runbook
    assert "After 4 aborts in a row" in runbook and "exits 78" in runbook
    assert "the committed configuration" not in runbook
    alerts = {a.name: a for a in every_alert(SHIFTED)}
    aborted, loop = alerts["DDPHangAborted"], alerts["DDPRestartLoop"]
    assert "24 s with complete evidence, 36 s otherwise" in aborted.meaning
    assert "(11 to 39 minutes)" in aborted.meaning
    assert "exit code, 76 by default" in aborted.description
    assert "(78 by default" in loop.description
    assert "`DDP_EXPORTER_ABORT_LIMIT` (4)" in loop.meaning and "(53) steps" in loop.meaning
    assert "published by rank 9" in alerts["DDPRankDown"].confirm


def test_a_runbook_generated_with_set_states_its_own_windows(tmp_path: Path) -> None:
    assert (
        main(
            [
                "generate",
                "--out",
                str(tmp_path),
                "--set",
                "hang_abort_window=1h30m",
                "--set",
                "baseline_window=45m",
                "--set",
                "restart_loop_window=2h",
                "--set",
                "heartbeat_stale_seconds=90",
                "--set",
                "fleet_carry=45m",
            ]
        )
        == 0
    )
    runbook = (tmp_path / "docs/runbook.md").read_text()
    assert "the run then has 1 hour 30 minutes (`hang_abort_window`)" in runbook
    assert "10 minutes" not in runbook
    assert "those of the configuration this runbook was generated" in runbook
    rules = yaml.safe_load((tmp_path / "dashboards/prometheus/rules.yml").read_text())
    described = {
        r["alert"]: r["annotations"]["description"]
        for g in rules["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert "within the last 45m" in described["DDPJobKilled"]
    assert "for over 90s" in described["DDPRankDown"]
    assert "[2h]" in described["DDPRestartLoop"]
    assert "[1h30m]" in described["DDPHangAborted"]
    assert "The fleet's memory survives a gap of up to 45m" in runbook


def test_the_late_peers_panel_counts_the_heartbeat_source_s_intervals() -> None:
    from exporter.sources import heartbeat

    # The mixin may not import the library's sources (tests/test_layout.py): a copy, checked.
    assert liveness_dashboard.LATE_AFTER_INTERVALS == heartbeat.LATE_AFTER_INTERVALS


def test_the_committed_runbook_says_so() -> None:
    assert "those of the committed configuration" in render_runbook(DEFAULT)
