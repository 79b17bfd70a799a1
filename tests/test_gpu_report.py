"""scripts/gpu_report.py: the GPU check's report from the files a run left, read without a GPU."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from harness import REPO

pytestmark = pytest.mark.unit

_JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.gpu.test_multi_gpu" name="test_nccl_killed_rank" time="80"/>
<testcase classname="tests.gpu.test_multi_gpu" name="test_nccl_stalled_gpu" time="90">
<failure message="AssertionError: no RAS answer&#10;more">trace</failure></testcase>
<testcase classname="tests.gpu.test_multi_gpu" name="test_timed[tp]" time="1">
<skipped type="pytest.xfail" message="comm_wait off by 30 %"/></testcase>
</testsuite></testsuites>"""

# pytest -rA's shape: a test's header, its captured stdout (blank lines inside), the next one.
_LOG = (
    """==================================== PASSES ====================================
___________________________________ test_nccl_killed_rank ___________________________________
----------------------------- Captured stdout call -----------------------------
killed rank: RAS reported

Errors: rank 1 dead
verdict:
hang episode 1
____________________________ test_timed[tp] ____________________________
----------------------------- Captured stdout call -----------------------------
"""
    + "\n".join(f"line {i}" for i in range(100))
    + """
=========================== short test summary info ============================
PASSED tests/gpu/test_multi_gpu.py::test_nccl_killed_rank
"""
)


def _report():
    spec = importlib.util.spec_from_file_location(
        "gpu_report", os.path.join(REPO, "scripts", "gpu_report.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_report_tables_each_drill_and_quotes_what_it_printed(tmp_path, capsys):
    (tmp_path / "multi-gpu-tests.xml").write_text(_JUNIT)
    (tmp_path / "multi-gpu-tests.log").write_text(_LOG)
    report = _report()
    assert report.main(["gpu_report.py", str(tmp_path), "42"]) == 0
    text = capsys.readouterr().out
    assert "whole check 42 s" in text
    assert "missing: gpu-tests.xml (the step did not run, or not to its end)" in text
    assert "1 FAILED, 1 passed, 1 xfail" in text
    assert (
        "| `test_multi_gpu::test_nccl_stalled_gpu` | FAILED | AssertionError: no RAS answer |"
        in text
    )
    printed = text.split("What the drills printed:")[1]
    killed = printed.split("`test_nccl_killed_rank`:")[1].split("```")[1]
    assert (
        killed
        == "text\nkilled rank: RAS reported\n\nErrors: rank 1 dead\nverdict:\nhang episode 1\n"
    )
    kept = report.MAX_PRINTED
    assert f"line {kept - 1}\n... {100 - kept} more lines\n```" in printed
    assert f"line {kept}\n" not in printed


def test_the_report_states_the_device_waits_cost_or_that_it_is_missing(tmp_path, capsys):
    report = _report()

    def printed(figures: dict | None = None) -> str:
        """Return the report of ``figures`` written as the benchmark writes them (None: none)."""
        if figures is not None:
            (tmp_path / "device-waits.json").write_text(json.dumps(figures))
        report.main(["gpu_report.py", str(tmp_path)])
        return capsys.readouterr().out

    assert "missing: device-waits.json (see device-waits.log)" in printed()
    figures = {
        "events": "cuda",
        "bare_us": 1.5,
        "not_timed_us": 0.25,
        "timed_us": 9.0,
        "every": 8,
        "amortised_us": 1.34,
        "errors": 0,
    }
    text = printed(figures)
    assert "adds 0.25 µs on a step it does not time, 9.00 µs on a step it times" in text
    assert "1.34 µs per wait at one step in 8; errors 0." in text
    assert "Work.wait()" not in text  # a report from before the Work.wait() arm
    figures["work_wait"] = {"not_timed_us": 0.5, "timed_us": 12.0, "amortised_us": 1.94}
    text = printed(figures)
    assert "`Work.wait()`: the exporter adds 0.50 µs on a step it does not time, 12.00 µs" in text
    assert "1.94 µs per wait." in text
    assert "classic FSDP" not in text  # a report from before the classic FSDP arm
    figures["classic_fsdp"] = {"not_timed_us": 0.4, "timed_us": 11.0, "amortised_us": 1.73}
    text = printed(figures)
    assert "classic FSDP wait: the exporter adds 0.40 µs on a step it does not time, 11.00" in text
    assert "1.73 µs per wait." in text
