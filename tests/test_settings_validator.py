"""The one validator of the exporter's variables: a bad value is logged once and never raised.

Per variable, in-process: the default is used, one line names the variable, the value, what is
accepted and the default, the process records it for ``ddp_exporter_invalid_setting_info``, and
the same value passed as a keyword raises with the same message. The torchrun job with every bad
variable at once is in ``test_misconfigured_job.py``.
"""

from __future__ import annotations

import ast
import logging
import os
from pathlib import Path

import pytest
from harness import REPO, parse

from exporter import catalog, settings
from exporter.export.collector import add_invalid_settings, family
from exporter.settings import validate

pytestmark = pytest.mark.unit

#: A value each variable does not accept (what a typo gives).
INVALID = {
    settings.PORT: "notaport",
    settings.ADDR: "local host",
    settings.HEARTBEAT_S: "soon",
    settings.MONITOR_RANK: "-2",
    settings.PEER_SERIES: "-5",
    settings.FLIGHT_RECORDER: "maybe",
    settings.COMM_TIMING: "sometimes",
    settings.ADVERTISE_ADDR: "http://node7:19400",
    settings.JOB_DEADLINE: "two days",
    settings.SLURM_JOB_END_TIME: "72h",
    settings.FINAL_SCRAPE_S: "-1",
    settings.ON_HANG: "explode",
    settings.ABORT_AFTER_S: "0",
    settings.ABORT_EXIT_CODE: "256",
    settings.ABORT_LIMIT: "many",
    settings.ABORT_PROGRESS_STEPS: "0",
    settings.GIVE_UP_EXIT_CODE: "300",
    settings.ATTEMPT: "-1",
    settings.NODE: "gpu node 7; rm",
    settings.HANG_PROBE: "sometimes",
    settings.GPU_HEALTH: "sometimes",
    settings.DEVICE_WAIT_EVERY: "-1",
    settings.AUTORUN: "sometimes",
    settings.DOCTOR_FAKE_VERSIONS: "gcc=13",
}
#: Variables any text is good for (a run name, a path); the dump folder is checked for writing.
ANY_TEXT = {
    settings.RUN,
    settings.FILE_SD,
    settings.DUMP_DIR,
    settings.WEB_CONFIG,
    settings.PROMETHEUS_BINARY,
    settings.ALERTMANAGER_BINARY,
    settings.GRAFANA_BINARY,
}


@pytest.fixture
def fresh(monkeypatch):
    """Forget what earlier tests in this process logged and recorded."""
    monkeypatch.setattr(validate, "_logged", set())
    monkeypatch.setattr(validate, "_invalid", {})
    return monkeypatch


def test_every_variable_of_the_exporter_goes_through_the_validator():
    names = {
        v
        for k, v in vars(settings).items()
        if k.isupper() and isinstance(v, str) and v.startswith("DDP_EXPORTER_")
    }
    assert names <= set(settings.SETTINGS), names - set(settings.SETTINGS)
    assert set(settings.SETTINGS) == set(INVALID) | ANY_TEXT


def _reads_of_the_environment(tree: ast.AST) -> list[tuple[int, str]]:
    """Return ``(line, key)`` of every ``X.get(key)``, ``X[key]`` and ``os.getenv(key)``.

    ``key`` is the literal text, or the name of the constant (``settings.FILE_SD``).
    """

    def key(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Attribute) and node.attr.isupper():
            return node.attr
        if isinstance(node, ast.Name) and node.id.isupper():
            return node.id
        return None

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("get", "getenv", "pop"):
                found.append((node.lineno, key(node.args[0])))
        elif isinstance(node, ast.Subscript) and key(node.value) != "SETTINGS":
            # The table itself (settings.SETTINGS[name]) is read for a default, not a value.
            found.append((node.lineno, key(node.slice)))
    return [(line, k) for line, k in found if k]


def test_no_module_reads_a_variable_of_the_exporter_outside_settings():
    """Every ``DDP_EXPORTER_*`` variable is read through :mod:`exporter.settings`'s table."""
    ours = {
        k: v
        for k, v in vars(settings).items()
        if k.isupper() and isinstance(v, str) and v.startswith("DDP_EXPORTER_")
    }
    package = Path(REPO) / "exporter"
    readers = []
    for path in sorted(package.rglob("*.py")):
        if path.is_relative_to(package / "settings"):
            continue
        for line, k in _reads_of_the_environment(ast.parse(path.read_text())):
            if k in ours or k.startswith("DDP_EXPORTER_"):
                readers.append(f"{path.relative_to(REPO)}:{line} {k}")
    assert not readers, readers


@pytest.mark.parametrize("name", sorted(INVALID))
def test_a_bad_value_is_logged_once_and_the_default_used(name, fresh, caplog):
    setting = settings.SETTINGS[name]
    raw = INVALID[name]
    fresh.setenv(name, raw)
    with caplog.at_level(logging.WARNING, logger="exporter"):
        assert settings.resolve(name) == setting.default
        assert settings.resolve(name) == setting.default  # read again: not logged again
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"ddp-exporter: {name}: expected {setting.accepted}, got {raw!r}")
    assert f"(default: {setting.default_text})" in line and "training goes on" in line
    assert "\n" not in line
    assert name in settings.invalid_settings()
    fresh.setenv(name, "")  # fixed: no longer reported
    assert name not in settings.invalid_settings()


@pytest.mark.parametrize("name", sorted(n for n in INVALID if settings.SETTINGS[n].keyword))
def test_the_same_value_as_a_keyword_raises_with_the_same_message(name, fresh):
    setting = settings.SETTINGS[name]
    value = INVALID[name]
    with pytest.raises(ValueError) as raised:
        settings.resolve(name, value)
    assert str(raised.value) == settings.setting_message(
        f"exporter.instrument({setting.keyword}=...)", value, setting, setting.keyword_accepted
    )


#: instrument()'s keyword -> for_instrument()'s parameter, where they differ.
_KW = {
    "run": "run",
    "flight_recorder": "flight_recorder_on",
    "otlp": "otlp",
    "heartbeat_s": "heartbeat_s",
    "monitor_rank": "monitor_rank",
}


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("run", 123),  # a label value that broke every scrape
        ("run", "  "),
        ("flight_recorder", "no"),  # a truthy string that turned the recorder on
        ("otlp", 5),  # pushed to the default endpoint
        ("otlp", "collector:4318"),
        ("heartbeat_s", 1e300),  # overflowed the heartbeat, goodput and forensics threads
        ("monitor_rank", 2),  # nobody would monitor a 2-rank job
    ],
)
def test_a_keyword_of_the_wrong_kind_or_past_its_range_raises_naming_it(keyword, value, fresh):
    with pytest.raises(ValueError, match=rf"^exporter\.instrument\({keyword}=\.\.\.\): expected"):
        settings.for_instrument(
            parallelism="ddp", group=(0, 2), environ={}, **{_KW[keyword]: value}
        )


def test_switch_keywords_take_bools_and_their_ints(fresh):
    for value, read in ((True, True), (False, False), (1, True), (0, False)):
        cfg = settings.for_instrument(
            parallelism="ddp", group=(0, 1), flight_recorder_on=value, environ={}
        )
        assert cfg.flight_recorder is read


def test_variables_past_their_range_or_blank(fresh, caplog):
    env = {
        settings.HEARTBEAT_S: "1e10",
        settings.MONITOR_RANK: "5",
        settings.RUN: "   ",
        settings.TORCHELASTIC_RUN_ID: "r1",
    }
    with caplog.at_level(logging.WARNING, logger="exporter"):
        cfg = settings.for_instrument(parallelism="ddp", group=(0, 2), environ=env)
    assert cfg.endpoint.heartbeat_s == settings.DEFAULT_HEARTBEAT_S
    assert cfg.endpoint.monitor_rank == 0
    assert cfg.identity.run == "r1"  # a blank run name is no name: the next source is used
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "DDP_EXPORTER_HEARTBEAT_S: expected seconds in 0..3600 (0: off), got '1e10'" in lines[0]
    assert "DDP_EXPORTER_MONITOR_RANK: expected a rank in -1..1 (-1: none), got '5'" in lines[1]


def test_a_good_value_is_read_and_nothing_logged(fresh, caplog):
    env = {
        settings.PORT: "19500",
        settings.ON_HANG: " Abort ",
        settings.FLIGHT_RECORDER: "off",
        settings.JOB_DEADLINE: "72h",
        settings.NODE: "gpu-7",
        settings.ATTEMPT: "2",
    }
    with caplog.at_level(logging.WARNING, logger="exporter"):
        assert settings.resolve(settings.PORT, environ=env) == 19500
        assert settings.resolve(settings.ON_HANG, environ=env) == "abort"
        assert settings.resolve(settings.FLIGHT_RECORDER, environ=env) is False
        assert settings.resolve(settings.JOB_DEADLINE, environ=env) == "72h"
        assert settings.node_name(env) == "gpu-7" and settings.attempt(env) == "2"
    assert caplog.records == []


def test_exit_codes_that_collide_use_both_defaults(fresh, caplog):
    fresh.setenv(settings.GIVE_UP_EXIT_CODE, "75")
    with caplog.at_level(logging.WARNING, logger="exporter"):
        hang = settings.on_hang("instrument")
    assert (hang.exit_code, hang.give_up_exit_code) == (75, 69)
    assert "DDP_EXPORTER_GIVE_UP_EXIT_CODE: expected an exit code in 1..255 other than" in (
        caplog.text
    )
    assert settings.invalid_settings() == [settings.GIVE_UP_EXIT_CODE]


def test_a_port_past_65535_with_the_local_rank(fresh, caplog):
    fresh.setenv(settings.PORT, "65535")
    fresh.delenv(settings.LOCAL_WORLD_SIZE, raising=False)
    env = dict(os.environ, LOCAL_RANK="1")
    with caplog.at_level(logging.WARNING, logger="exporter"):
        assert settings.endpoint("instrument", environ=env).port == settings.DEFAULT_PORT + 1
    assert "port + LOCAL_RANK (1) <= 65535" in caplog.text
    # The node's other ranks are unknown: a keyword cannot be judged alike on every rank, so
    # this one says so and takes the default instead of raising where its peers go on.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="exporter"):
        assert settings.endpoint("instrument", port=65535, environ=env).port == 19401
    assert "exporter.instrument(port=...): expected a base port" in caplog.text


def test_a_port_too_high_for_the_node_is_judged_alike_on_each_of_its_ranks(fresh, caplog):
    """Under torchrun every rank knows the node's ranks: local rank 0 judges as rank 1 does."""
    for local_rank in ("0", "1"):
        env = {settings.LOCAL_RANK: local_rank, settings.LOCAL_WORLD_SIZE: "2"}
        with pytest.raises(ValueError, match=r"port \+ LOCAL_RANK \(1\) <= 65535, got 65535"):
            settings.endpoint("instrument", port=65535, environ=env)
        with caplog.at_level(logging.WARNING, logger="exporter"):
            port = settings.endpoint("instrument", environ={**env, settings.PORT: "65535"}).port
        assert port == settings.DEFAULT_PORT + int(local_rank)
    assert settings.endpoint("instrument", port=65534, environ=env).port == 65535


def test_an_unwritable_dump_folder_is_reported_with_where_dumps_go(fresh, caplog, tmp_path):
    good = tmp_path / "dumps"
    assert settings.usable_dump_dir(str(good)) == str(good) and good.is_dir()  # created
    bad = "/proc/ddp-exporter-cannot-be-here"
    fresh.setenv(settings.DUMP_DIR, bad)
    with caplog.at_level(logging.WARNING, logger="exporter"):
        used = settings.usable_dump_dir(settings.dump_dir(None))
    assert used != bad and os.access(used, os.W_OK)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"ddp-exporter: {settings.DUMP_DIR}: expected a folder this process")
    assert f"hang dumps go to {used} instead" in line
    assert settings.invalid_settings() == [settings.DUMP_DIR]


def test_a_file_sd_folder_that_cannot_be_made_is_reported_and_passed_over(fresh, caplog):
    bad = "/proc/ddp-exporter-cannot-be-here"
    fresh.setenv(settings.FILE_SD, bad)
    with caplog.at_level(logging.WARNING, logger="exporter"):
        assert settings.file_sd_dir() is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"ddp-exporter: {settings.FILE_SD}: expected a folder this process")
    assert "no file_sd target is written" in line
    assert settings.invalid_settings() == [settings.FILE_SD]


def test_the_rank_publishes_one_info_series_per_bad_variable(fresh):
    for name in (settings.ON_HANG, settings.COMM_TIMING):
        fresh.setenv(name, INVALID[name])
        settings.resolve(name)
    fam = family(catalog.INVALID_SETTING)
    add_invalid_settings(fam, ["r", "0"])
    from prometheus_client import CollectorRegistry, generate_latest

    class One:
        def collect(self):
            yield fam

    registry = CollectorRegistry()
    registry.register(One())
    samples = parse(generate_latest(registry).decode())[catalog.INVALID_SETTING.name]
    assert sorted(lab["variable"] for lab, _ in samples) == [settings.COMM_TIMING, settings.ON_HANG]
    assert all(v == 1 and lab["run"] == "r" and lab["rank"] == "0" for lab, v in samples)


def test_instrument_settings_resolve_in_one_call_with_the_rules_between_them(fresh, tmp_path):
    env = {
        settings.PORT: "19500",
        settings.HEARTBEAT_S: "2",
        settings.ON_HANG: "abort",
        settings.DUMP_DIR: str(tmp_path / "dumps"),
        settings.LOCAL_RANK: "1",
    }
    cfg = settings.for_instrument(parallelism="ddp", group=(1, 4), port=0, environ=env)
    assert cfg.endpoint.port == 0 and cfg.endpoint.heartbeat_s == 2.0  # a keyword wins
    assert cfg.on_hang.action == "abort" and cfg.comm_timing == "auto"
    assert (cfg.identity.rank, cfg.identity.world_size) == (1, 4)
    assert cfg.dump_dir == str(tmp_path / "dumps") and (tmp_path / "dumps").is_dir()
    assert cfg.file_sd_dir is None and cfg.hang_probe  # unset: the defaults
    found = {settings.FILE_SD: str(tmp_path / "sd"), settings.HANG_PROBE: "off"}
    cfg = settings.for_instrument(parallelism="ddp", group=(0, 2), environ=found)
    assert (cfg.file_sd_dir, cfg.hang_probe) == (str(tmp_path / "sd"), False)
    # The hang action from the environment, but no heartbeat: logged, turned off, no raise.
    quiet = settings.for_instrument(parallelism="ddp", group=(0, 2), heartbeat_s=0, environ=env)
    assert quiet.on_hang.action == "off" and quiet.keywords == frozenset()
    # Given as a keyword, it raises.
    with pytest.raises(ValueError, match="needs the hang watcher"):
        settings.for_instrument(
            parallelism="ddp", group=(0, 2), heartbeat_s=0, hang_action="abort", environ=env
        )
    with pytest.raises(ValueError, match="leave comm_timing out"):
        settings.for_instrument(parallelism="fsdp2", group=(0, 2), timing="hook", environ={})
    with pytest.raises(ValueError, match="start_step"):
        settings.for_instrument(parallelism="ddp", group=(0, 2), start_step=-1, environ={})
