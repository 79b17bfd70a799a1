"""Test the mixin's configuration: one flat MixinConfig assembled from per-domain dataclasses."""

from __future__ import annotations

import dataclasses
import math

import pytest

from exporter.mixin.config import DEFAULT, DOMAINS, FAST, MixinConfig, config_from
from exporter.mixin.config.fleet import FleetConfig
from exporter.mixin.config.goodput import GoodputConfig
from exporter.mixin.config.windows import WindowConfig
from exporter.mixin.promql import check_matchers, string

pytestmark = pytest.mark.unit


def _names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def test_the_fields_keep_the_order_of_the_domains() -> None:
    # dashboards/mixin.json and the reference page follow this order.
    assert MixinConfig.__bases__ == DOMAINS[::-1]
    assert _names(MixinConfig) == [name for domain in DOMAINS for name in _names(domain)]


def test_each_domain_owns_its_fields_and_a_title_of_its_own() -> None:
    names = [name for domain in DOMAINS for name in _names(domain)]
    assert len(names) == len(set(names))
    titles = [domain.TITLE for domain in DOMAINS]
    assert all(titles) and len(titles) == len(set(titles))


def test_each_domain_works_alone_with_the_defaults_of_the_whole() -> None:
    for domain in DOMAINS:
        alone = domain()
        assert all(getattr(alone, n) == getattr(DEFAULT, n) for n in _names(domain)), domain


@pytest.mark.parametrize(
    ("domain", "changes", "message"),
    [
        (GoodputConfig, {"goodput_min_ettr": 1.0}, "goodput_min_ettr must be in (0, 1): 1.0"),
        (FleetConfig, {"fleet_carry": "1s"}, "fleet_carry must be at least twice fleet_interval"),
        (
            WindowConfig,
            {"restart_loop_window": "1m"},
            "restart_loop_window must be at least baseline_window",
        ),
    ],
)
def test_a_domain_refuses_a_bad_value_alone_and_in_the_whole(domain, changes, message) -> None:
    for make in (domain, MixinConfig, lambda **kw: dataclasses.replace(FAST, **kw)):
        with pytest.raises(ValueError) as err:
            make(**changes)
        assert str(err.value) == message


def test_the_public_api_stays_flat() -> None:
    cfg = MixinConfig(job="train", goodput_window="2h")
    assert (cfg.job, cfg.goodput_window, cfg.stalled_for) == ("train", "2h", DEFAULT.stalled_for)
    assert dataclasses.replace(DEFAULT, stalled_for="5m").stalled_for == "5m"
    assert config_from({"shards": 3}).shards == 3 and config_from({}) == DEFAULT
    assert DEFAULT.hang_policy.stall_min_seconds == DEFAULT.stall_min_seconds
    assert not DEFAULT.receivers_set and "TITLE" not in _names(MixinConfig)


@pytest.mark.parametrize(
    "selector",
    ["", 'cluster="a"', "cluster='a', env!~\"dev|test\"", ' a = "b" , c=~".*" ', 'a="\\u00e9\\""'],
)
def test_the_selector_may_be_any_list_of_label_matchers(selector: str) -> None:
    assert MixinConfig(selector=selector).selector == selector
    check_matchers(selector)


@pytest.mark.parametrize(
    "selector",
    ["}{", 'a="b",', ",", "a=b", 'a="b" b="c"', 'a="\\q"', 'a="`"', 'a.b="c"', 'a="\\ud800"'],
)
def test_a_selector_that_is_no_list_of_label_matchers_is_refused(selector: str) -> None:
    for make in (MixinConfig, lambda **kw: config_from(kw)):
        with pytest.raises(ValueError, match="^selector: ") as err:
            make(selector=selector)
        assert repr(selector) in str(err.value)


def test_a_label_value_is_quoted_whatever_it_holds() -> None:
    assert string('a"b\\c\nd é') == '"a\\"b\\\\c\\nd é"'
    assert string("😀") == '"😀"'  # no \ud83d\ude00: PromQL refuses half a surrogate pair


@pytest.mark.parametrize("url", ["http://x/{{y}}", "wiki/runbook", "https://a b", ""])
def test_the_runbook_is_an_http_url_no_template_reads_into(url: str) -> None:
    with pytest.raises(ValueError, match="^runbook_base_url must be an http"):
        MixinConfig(runbook_base_url=url)


#: Every number of the config, with values out of its meaning's range.
_OUT_OF_RANGE = {
    "straggler_ratio": (math.nan, math.inf, -1.0, 0.5),
    "link_rtt_ratio": (math.nan, 0.9),
    "straggler_min_excess_seconds": (math.nan, -0.01),
    "link_min_rtt_seconds": (math.inf, -1.0),
    "link_comm_share": (math.nan, 1.0),
    "input_bound_share": (0.0, 1.0, math.nan),
    "stall_latency_factor": (math.inf, 0.0),
    "stall_min_seconds": (math.nan, math.inf),
    "heartbeat_stale_seconds": (math.nan, 0.0),
    "gpu_memory_ratio": (1.5, math.nan, 0.0),
    "gpu_clock_ratio": (1.0, math.nan),
    "throughput_drop_ratio": (0.0, math.inf),
    "init_stuck_seconds": (math.inf, -5.0),
    "job_deadline_margin_seconds": (math.nan, math.inf, -1.0),
    "timeout_warning_ratio": (math.nan, 0.0),
    "timeout_critical_ratio": (math.nan, 1.5),
    "goodput_min_ettr": (math.nan, 1.0),
    "goodput_min_evidence": (math.nan, 0.0),
}


def test_every_number_of_the_config_has_its_range() -> None:
    floats = [f.name for f in dataclasses.fields(MixinConfig) if f.type in (float, "float")]
    assert sorted(floats) == sorted(_OUT_OF_RANGE)


@pytest.mark.parametrize(
    ("name", "value"), [(n, v) for n, values in _OUT_OF_RANGE.items() for v in values]
)
def test_a_number_out_of_its_range_is_refused_naming_the_field(name: str, value: float) -> None:
    for make in (MixinConfig, lambda **kw: config_from(kw)):
        with pytest.raises(ValueError, match=name):
            make(**{name: value})


@pytest.mark.parametrize("refresh", ["xyz", "", "0s", "1m30s", "10", "-5s"])
def test_the_dashboard_refresh_is_a_duration_grafana_reads(refresh: str) -> None:
    with pytest.raises(ValueError, match="^dashboard_refresh must be a duration"):
        MixinConfig(dashboard_refresh=refresh)
    assert MixinConfig(dashboard_refresh="1h").dashboard_refresh == "1h"


@pytest.mark.parametrize("uid", ["", "a b", 'x"y', "x" * 41, "prom/1"])
def test_the_datasource_uid_is_one_grafana_accepts(uid: str) -> None:
    """A blank or quoted uid was written into every panel, which then found no datasource."""
    with pytest.raises(ValueError, match="^datasource_uid must be 1 to 40 letters"):
        MixinConfig(datasource_uid=uid)
    assert MixinConfig(datasource_uid="my_prom-2").datasource_uid == "my_prom-2"
