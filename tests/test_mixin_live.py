"""Run every dashboard query against a real Prometheus scraping a real instrumented DDP run.

A module fixture starts a 2-rank gloo demo job (``exporter.tools.trainer`` under torchrun), writes a
file_sd file for its endpoints, and starts Prometheus (1 s scrape and rule evaluation) with the
committed DEFAULT recording/alert rules. ``live_targets`` is the seam: point it at other
endpoints (e.g. a fault drill's job) and the same checks apply.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Job, wait_for
from promstack import Prometheus, require, run_prometheus, write_file_sd

from exporter.deploy import stack
from exporter.mixin import dashboards, rules
from exporter.mixin.config import DEFAULT, duration_seconds

pytestmark = pytest.mark.stack

RUN = "mixin-live"
RANKS = 2
SUBSTITUTE = {
    "$__rate_interval": "15s",
    "$cluster": ".*",
    "$run": RUN,
    "$rank": ".*",
    "$node": ".*",
}


def _substitute(expr: str) -> str:
    for var, value in SUBSTITUTE.items():
        expr = expr.replace(var, value)
    return expr


def _panels() -> list[tuple[str, dashboards.PanelSpec, str, bool]]:
    """Return (stem, panel spec, concrete PromQL, instant) of every target Grafana will load.

    The queries come from the committed dashboards/grafana/*.json (what users import), each
    with its own ``instant`` flag; the spec of the same panel says when it may be empty.
    """
    root = Path(__file__).resolve().parents[1] / "dashboards" / "grafana"
    out = []
    for dash in dashboards.dashboard_specs(DEFAULT):
        shipped = json.loads((root / f"{dash.stem}.json").read_text())["panels"]
        assert [p["title"] for p in shipped] == [p.title for p in dash.panels], dash.stem
        for spec, panel in zip(dash.panels, shipped):
            for target in panel["targets"]:
                out.append((dash.stem, spec, _substitute(target["expr"]), target["instant"]))
    return out


PANELS = _panels()


@pytest.fixture(scope="module")
def live_targets() -> Iterator[list[tuple[str, str, str]]]:
    """Yield ``(host:port, run, rank)`` of a running instrumented job; stop it afterwards."""
    require("prometheus")
    with Job(
        RANKS,
        ["--duration", "600", "--port", "0", "--addr", "127.0.0.1", "--heartbeat", "1"],
        env={"DDP_EXPORTER_RUN": RUN, "OMP_NUM_THREADS": "1"},
    ) as job:
        urls = job.wait_urls(timeout=120)
        yield [
            (re.sub(r"^https?://([^/]+)/.*$", r"\1", url), RUN, str(rank))
            for rank, url in sorted(urls.items())
        ]


@pytest.fixture(scope="module")
def prom(tmp_path_factory, live_targets) -> Iterator[Prometheus]:
    """Yield a Prometheus scraping ``live_targets`` with the DEFAULT rules loaded."""
    workdir: Path = tmp_path_factory.mktemp("prometheus")
    (workdir / "rules.yml").write_text(rules.render_rules(DEFAULT))
    sd_dir = workdir / "file_sd"
    sd_dir.mkdir()
    write_file_sd(
        sd_dir / "targets.json",
        [(target, {"run": run, "rank": rank}) for target, run, rank in live_targets],
    )
    config = stack.prometheus_config(
        DEFAULT,
        rule_files=[str(workdir / "rules.yml")],
        file_sd_files=[str(sd_dir / "*.json")],
        alertmanagers=(),
        scrape_interval="1s",
        evaluation_interval="1s",
    )
    with run_prometheus(workdir, config) as p:
        wait_for(lambda: len(p.targets_up()) == len(live_targets), 60, "targets up")
        yield p


def _has_data(p: Prometheus, expr: str, instant: bool = False) -> bool:
    """Return whether ``expr`` has data the way Grafana asks: instant, or over the last 30 s."""
    if instant:
        return bool(p.query(expr))
    end = time.time()
    data = p.api("query_range", query=expr, start=str(end - 30), end=str(end), step="1")
    return bool(data["result"])


def test_up_carries_run_and_rank_from_file_sd(prom: Prometheus) -> None:
    result = prom.query(f'up{{job="{DEFAULT.job}"}}')
    assert sorted((r["metric"]["run"], r["metric"]["rank"]) for r in result) == [
        (RUN, str(r)) for r in range(RANKS)
    ]


def test_every_panel_query_executes(prom: Prometheus) -> None:
    for stem, panel, expr, instant in PANELS:
        try:
            prom.query(expr)  # Prometheus parses it: a syntax error fails here
            _has_data(prom, expr, instant)
        except Exception as exc:  # report which panel broke
            raise AssertionError(f"{stem} / {panel.title}: {expr}\n{exc}") from exc


def test_variable_queries_return_values(prom: Prometheus) -> None:
    for var in dashboards.build(dashboards.dashboard_specs(DEFAULT)[0])["templating"]["list"][1:]:
        selector = re.sub(r"^label_values\((.*), (\w+)\)$", r"\1", var["query"])
        label = re.sub(r"^label_values\((.*), (\w+)\)$", r"\2", var["query"])
        result = prom.query(_substitute(selector))
        if var["name"] == "cluster":
            # One Prometheus, no cluster label: no value, and "All" (.*) matches the absent
            # label, so every other variable and panel still has data (asserted here).
            assert result and not {r["metric"].get(label) for r in result} - {None}
            continue
        assert {r["metric"].get(label) for r in result} - {None}, var["name"]


def test_panels_that_should_have_data_have_it(prom: Prometheus) -> None:
    expected = [(s, p, e, i) for s, p, e, i in PANELS if not p.needs]
    missing: list[str] = []

    def all_have_data() -> bool:
        missing[:] = [f"{s} / {p.title}" for s, p, e, i in expected if not _has_data(prom, e, i)]
        return not missing

    # The goodput panels read increases of series recorded once per goodput_interval: they have
    # data from the second evaluation of that group on.
    timeout = 90 + 2 * duration_seconds(DEFAULT.goodput_interval)
    try:
        wait_for(all_have_data, timeout, "data in every panel", interval=1.0)
    except AssertionError as exc:
        raise AssertionError(f"panels without data: {missing}") from exc


def test_healthy_run_blames_nobody(prom: Prometheus) -> None:
    r = rules.recorded(DEFAULT)
    wait_for(
        lambda: len(prom.query(f'{r.straggler_score}{{run="{RUN}"}}')) == RANKS,
        60,
        "a straggler score for every rank",
    )
    # Scrapes of different ranks are offset in time, so sequence numbers differ transiently;
    # the collective alerts only look at that lag while a collective is stuck.
    stuck = prom.query(f'{r.inflight_ratio_run}{{run="{RUN}"}} > {DEFAULT.timeout_warning_ratio}')
    assert stuck == [], stuck
    firing = prom.query(f'ALERTS{{run="{RUN}", alertstate="firing"}}')
    assert firing == [], firing
