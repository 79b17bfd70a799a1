"""exporter.sources.walltime: the job's deadline from the environment, its start, and its total steps."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import torch
from harness import REPO, parse, scrape_text, value

import exporter
from exporter import settings
from exporter.settings import parse_deadline as parse_job_deadline
from exporter.sources.walltime import JobClock, resolve_job_clock

NOW = 1_800_000_000.0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1767225600", 1767225600.0),
        (" 1767225600.5 ", 1767225600.5),
        ("72h", NOW + 72 * 3600),
        ("90m", NOW + 90 * 60),
        ("3600s", NOW + 3600),
        ("1d12h", NOW + 36 * 3600),
        ("1h30m15s", NOW + 5415),
    ],
)
def test_exporter_variable_takes_a_unix_time_or_a_duration(raw: str, expected: float) -> None:
    assert parse_job_deadline(settings.JOB_DEADLINE, raw, NOW) == expected


@pytest.mark.unit
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("3600", "is not a Unix time.*write a unit, e.g. 3600s"),
        ("72 hours", "neither a Unix time nor a duration"),
        ("0s", "must be positive"),
        ("-5", "is not a Unix time"),
        ("nan", "is not a Unix time"),
    ],
)
def test_bad_exporter_deadlines_name_the_variable(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"DDP_EXPORTER_JOB_DEADLINE=.*{message}"):
        parse_job_deadline(settings.JOB_DEADLINE, raw, NOW)


@pytest.mark.unit
@pytest.mark.parametrize("raw", ["72h", "soon", "12"])
def test_slurm_end_time_must_be_a_unix_time(raw: str) -> None:
    # Not a Unix time: logged, and the job has no deadline (exporter.settings never raises).
    assert resolve_job_clock(environ={settings.SLURM_JOB_END_TIME: raw}) == JobClock()


@pytest.mark.unit
def test_deadline_sources_and_precedence() -> None:
    assert resolve_job_clock(environ={}) == JobClock()
    assert resolve_job_clock(environ={settings.SLURM_JOB_END_TIME: "0"}).deadline_unix is None
    slurm = resolve_job_clock(environ={settings.SLURM_JOB_END_TIME: "1767225600"})
    assert (slurm.deadline_unix, slurm.deadline_source) == (
        1767225600.0,
        settings.SLURM_JOB_END_TIME,
    )
    both = resolve_job_clock(
        environ={settings.SLURM_JOB_END_TIME: "1767225600", settings.JOB_DEADLINE: "1767229200"}
    )
    assert (both.deadline_unix, both.deadline_source) == (1767229200.0, settings.JOB_DEADLINE)


@pytest.mark.unit
def test_total_steps_from_the_keyword_or_dataloader_length_times_epochs() -> None:
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(10, 1)), 3)
    assert resolve_job_clock(total_steps=500, environ={}).total_steps == 500
    assert resolve_job_clock(epochs=7, dataloader=loader, environ={}).total_steps == 4 * 7


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"total_steps": 0}, r"total_steps=...\): expected an int > 0"),
        ({"total_steps": 1.5}, r"total_steps=...\): expected an int > 0"),
        ({"total_steps": True}, r"total_steps=...\): expected an int > 0"),
        ({"epochs": -1, "dataloader": []}, r"epochs=...\): expected an int > 0"),
        ({"epochs": 2}, r"needs dataloader="),
        ({"total_steps": 5, "epochs": 2}, "not both"),
        (
            {"epochs": 2, "dataloader": torch.utils.data.DataLoader(_Stream())},
            "has no length",
        ),
    ],
)
def test_bad_total_work_is_a_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_job_clock(environ={}, **kwargs)


# exporter.sources.walltime imports no torch: each process starts in a fraction of a second.
_LIGHT_IMPORT = (
    "import os, sys; sys.path.insert(0, sys.argv[1]); "
    "from exporter.sources.walltime import job_start_unix, process_start_unix; "
)
_PARENT = textwrap.dedent(
    """
    import subprocess, time
    print(process_start_unix(os.getpid()), flush=True)
    time.sleep(1.5)  # the workers start well after their launcher
    child = IMPORT + "print(job_start_unix(), process_start_unix(os.getpid()), flush=True)"
    for run_id in ("run-1", ""):  # under torchrun, then not
        env = dict(os.environ, TORCHELASTIC_RUN_ID=run_id)
        subprocess.run([sys.executable, "-c", child, sys.argv[1]], env=env, check=True)
    """
)


@pytest.mark.tool
def test_job_start_is_the_launcher_start_under_torchrun_else_the_process_start() -> None:
    parent = _LIGHT_IMPORT + f"IMPORT = {_LIGHT_IMPORT!r}\n" + _PARENT
    out = subprocess.run(
        [sys.executable, "-c", parent, REPO],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    launcher, torchrun_start, torchrun_child, plain_start, plain_child = map(float, out)
    assert time.time() - launcher < 60
    assert torchrun_child - launcher > 1.0 and plain_child - launcher > 1.0
    assert abs(torchrun_start - launcher) < 0.05  # the launcher's start, not the worker's
    assert abs(plain_start - plain_child) < 0.05  # the rank's own process start


@pytest.mark.unit
def test_instrument_publishes_deadline_and_total_steps(ddp, monkeypatch) -> None:
    model, loader, opt = ddp
    monkeypatch.setenv(settings.SLURM_JOB_END_TIME, "1767225600")
    obs = exporter.instrument(model, dataloader=loader, epochs=3, port=0, addr="127.0.0.1")
    s = parse(scrape_text(f"http://127.0.0.1:{obs.port}/metrics"))
    assert value(s, "ddp_job_deadline_timestamp_seconds") == 1767225600.0
    assert value(s, "ddp_job_total_steps") == len(loader) * 3


@pytest.mark.unit
def test_a_bad_deadline_is_logged_naming_the_variable(ddp, monkeypatch, caplog) -> None:
    model, _, _ = ddp
    monkeypatch.setenv(settings.JOB_DEADLINE, "two days")
    with caplog.at_level("WARNING", logger="exporter"):
        obs = exporter.instrument(model, port=0, addr="127.0.0.1")
    assert "DDP_EXPORTER_JOB_DEADLINE: expected" in caplog.text and "'two days'" in caplog.text
    s = parse(scrape_text(f"http://127.0.0.1:{obs.port}/metrics"))
    assert "ddp_job_deadline_timestamp_seconds" not in s
    obs.close()


@pytest.mark.unit
def test_without_a_deadline_or_total_nothing_is_published(ddp, monkeypatch) -> None:
    model, _, _ = ddp
    monkeypatch.delenv(settings.JOB_DEADLINE, raising=False)
    monkeypatch.delenv(settings.SLURM_JOB_END_TIME, raising=False)
    obs = exporter.instrument(model, port=0, addr="127.0.0.1")
    s = parse(scrape_text(f"http://127.0.0.1:{obs.port}/metrics"))
    assert "ddp_job_deadline_timestamp_seconds" not in s
    assert "ddp_job_total_steps" not in s
