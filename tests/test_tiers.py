"""The tier markers: every test carries exactly one, and a test without one cannot be collected."""

from __future__ import annotations

import pytest
from tiers import TIERS

pytestmark = pytest.mark.unit

pytest_plugins = ["pytester"]

#: The conftest of a contributor's checkout: the tier plugin, as tests/conftest.py loads it.
_CONFTEST = "from tiers import pytest_collection_modifyitems, pytest_configure  # noqa: F401\n"

#: A test module the way a contributor might write one: tiers, no tier, two tiers.
_MODULE = """
import pytest

@pytest.mark.unit
def test_marked():
    pass

def test_forgotten():
    pass

@pytest.mark.job
@pytest.mark.stack
def test_twice():
    pass
"""


def test_every_tier_is_registered(pytestconfig: pytest.Config) -> None:
    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert set(TIERS) <= registered


def test_a_test_without_a_tier_or_with_two_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_contributed=_MODULE)
    result = pytester.runpytest_inprocess("--strict-markers", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*every test needs exactly one tier marker*",
            "*test_contributed.py::test_forgotten: no tier",
            "*test_contributed.py::test_twice: job, stack",
        ]
    )
    assert "test_marked" not in result.stderr.str()


def test_a_module_mark_is_the_tier_of_each_of_its_tests(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(
        test_module_tier="import pytest\npytestmark = pytest.mark.tool\ndef test_a():\n    pass\n"
    )
    result = pytester.runpytest_inprocess("--strict-markers", "-m", "tool")
    result.assert_outcomes(passed=1)
