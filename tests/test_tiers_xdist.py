"""The tiers' groups as pytest-xdist sees them, in a real parallel run (worker processes)."""

from __future__ import annotations

import os

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.tool

pytest_plugins = ["pytester"]


def test_xdist_schedules_by_the_groups_the_plugin_adds(pytester: pytest.Pytester) -> None:
    """The groups reach pytest-xdist: its nodeids carry them, so loadgroup keeps them together."""
    # Worker processes: the plugins import from this folder, as the suite's conftest.py does.
    pytester.makeconftest(
        f"import sys\nsys.path.insert(0, {TESTS!r})\npytest_plugins = ['tiers', 'scheduling']\n"
    )
    pytester.makepyfile(
        test_mixed=(
            "import pytest\n"
            "@pytest.mark.stack\n@pytest.mark.solo\ndef test_healthy():\n    pass\n"
            "@pytest.mark.lab\ndef test_link():\n    pass\n"
            "@pytest.mark.unit\ndef test_cheap():\n    pass\n"
        )
    )
    result = pytester.runpytest_subprocess(
        "--strict-markers", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    assert "test_mixed.py::test_healthy@solo" in out and "test_mixed.py::test_link@lab" in out, out
