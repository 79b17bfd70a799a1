"""The tier markers: every test carries exactly one, and a test without one cannot be collected."""

from __future__ import annotations

import os

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


def test_the_costliest_tests_come_first_then_solo_tests_then_fast_modules(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest('pytest_plugins = ["tiers", "scheduling"]\n')
    pytester.makepyfile(
        test_a_units="import pytest\npytestmark = pytest.mark.unit\ndef test_u():\n    pass\n",
        test_b_mixed=(
            "import pytest\n"
            "@pytest.mark.unit\ndef test_cheap():\n    pass\n"
            "@pytest.mark.stack\ndef test_drill():\n    pass\n"
            "@pytest.mark.stack\n@pytest.mark.solo\ndef test_healthy():\n    pass\n"
        ),
        test_c_jobs="import pytest\npytestmark = pytest.mark.job\ndef test_j():\n    pass\n",
        test_d_lab="import pytest\npytestmark = pytest.mark.lab\ndef test_l():\n    pass\n",
    )
    result = pytester.runpytest_inprocess("--strict-markers", "--collect-only", "-q")
    order = [line for line in result.outlines if "::" in line]
    assert order == [
        "test_d_lab.py::test_l",
        "test_b_mixed.py::test_cheap",  # its module goes where its costliest test puts it
        "test_b_mixed.py::test_drill",
        "test_c_jobs.py::test_j",
        "test_b_mixed.py::test_healthy",
        "test_a_units.py::test_u",
    ]


def test_a_pytest_run_inside_a_test_leaves_the_outer_runs_locks_alone(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from scheduling import LOCKS

    outer = tmp_path / "locks"
    outer.mkdir()
    monkeypatch.setenv(LOCKS, str(outer))  # as on a worker of a parallel run
    pytester.makeconftest('pytest_plugins = ["tiers", "scheduling"]\n')
    pytester.makepyfile(
        test_inner="import pytest\npytestmark = pytest.mark.unit\ndef test_a():\n    pass\n"
    )
    pytester.runpytest_inprocess("--strict-markers").assert_outcomes(passed=1)
    assert outer.is_dir() and os.environ.get(LOCKS) == str(outer)


def _groups(pytester: pytest.Pytester, **modules: str) -> dict[str, str | None]:
    """Collect ``modules`` with the tier and scheduling plugins; map each test to its group."""
    pytester.makeconftest('pytest_plugins = ["tiers", "scheduling"]\n')
    pytester.makepyfile(**modules)
    items, _ = pytester.inline_genitems("--strict-markers")
    groups = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        groups[item.name] = marker.args[0] if marker else None
    return groups


def test_solo_tests_are_one_group_on_one_worker(pytester: pytest.Pytester) -> None:
    groups = _groups(
        pytester,
        test_mixed=(
            "import pytest\n"
            "@pytest.mark.stack\n@pytest.mark.solo\ndef test_healthy():\n    pass\n"
            "@pytest.mark.lab\n@pytest.mark.solo\ndef test_bandwidth():\n    pass\n"
            "@pytest.mark.lab\ndef test_link():\n    pass\n"
            "@pytest.mark.stack\ndef test_drill():\n    pass\n"
        ),
    )
    assert groups == {
        "test_healthy": "solo",
        "test_bandwidth": "solo",
        "test_link": "lab",
        "test_drill": None,
    }


def test_tests_sharing_a_module_fixture_are_one_group(pytester: pytest.Pytester) -> None:
    groups = _groups(
        pytester,
        test_shared=(
            "import pytest\n"
            "pytestmark = pytest.mark.job\n"
            "@pytest.fixture(scope='module')\ndef job():\n    return 1\n"
            "def test_a(job):\n    pass\n"
            "def test_b(job):\n    pass\n"
            "def test_alone(tmp_path):\n    pass\n"
            "@pytest.mark.xdist_group('default-ports')\ndef test_ports(job):\n    pass\n"
        ),
    )
    assert groups == {
        "test_a": "test_shared.py",
        "test_b": "test_shared.py",
        "test_alone": None,
        "test_ports": "default-ports",
    }


def test_a_run_of_solo_tests_keeps_the_room_from_the_first_to_the_last(tmp_path) -> None:
    import threading

    from harness import wait_for
    from scheduling import SoloBlock, turn

    block, entered, done = SoloBlock(), threading.Event(), threading.Event()

    def shared() -> None:
        with turn(tmp_path, exclusive=False):
            entered.set()
        done.set()

    block.enter(tmp_path)  # the first solo test
    waiter = threading.Thread(target=shared)
    waiter.start()
    block.leave(next_is_solo=True)
    block.enter(tmp_path)  # the second: the room was never given back
    assert block.held and not entered.wait(0.5)
    block.leave(next_is_solo=False)  # the last of the run
    assert not block.held
    wait_for(done.is_set, 10, "the shared holder in once the run of solo tests ended")
    waiter.join(10)


def test_the_solo_block_waits_for_every_shared_test_of_the_run(tmp_path) -> None:
    import threading

    from harness import wait_for
    from scheduling import Tally

    tally, result = Tally(tmp_path), []
    waiter = threading.Thread(target=lambda: result.append(tally.wait(3, poll=0.01)))
    waiter.start()
    for _ in range(2):
        tally.add()  # each from another worker, in the run
    assert tally.count() == 2 and not result
    tally.add()
    wait_for(lambda: result == [True], 10, "the block's turn once the third test ended")
    waiter.join(10)
    # A test that never ends (its worker crashed) holds the block only for the patience.
    assert Tally(tmp_path).wait(4, patience=0.05, poll=0.01) is False


def test_a_waiting_solo_test_keeps_new_shared_holders_out(tmp_path) -> None:
    import fcntl
    import threading

    from harness import wait_for
    from scheduling import turn

    entered: list[str] = []
    release = {name: threading.Event() for name in "ASB"}

    def hold(name: str, exclusive: bool) -> None:
        with turn(tmp_path, exclusive):
            entered.append(name)
            release[name].wait(30)

    def turnstile_taken() -> bool:
        with open(tmp_path / "turnstile", "a") as gate:
            try:
                fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(gate, fcntl.LOCK_UN)
            return False

    threads = {
        "A": threading.Thread(target=hold, args=("A", False)),
        "S": threading.Thread(target=hold, args=("S", True)),
        "B": threading.Thread(target=hold, args=("B", False)),
    }
    threads["A"].start()
    wait_for(lambda: entered == ["A"], 10, "the first shared holder in")
    threads["S"].start()
    wait_for(turnstile_taken, 10, "the solo test waiting at the turnstile")
    threads["B"].start()
    release["A"].set()
    wait_for(lambda: "S" in entered, 10, "the solo test in once the room is empty")
    assert entered == ["A", "S"]  # B came after S began to wait: it waits for S
    release["S"].set()
    wait_for(lambda: entered == ["A", "S", "B"], 10, "the later shared holder in after")
    release["B"].set()
    for t in threads.values():
        t.join(10)


def test_a_worker_yields_the_cpu_for_the_fast_tests_and_takes_it_back_where_allowed() -> None:
    import contextlib
    import threading

    from scheduling import YIELD_NICE, Priority

    seen: dict[str, int] = {}

    def worker() -> None:  # a thread: its priority is its own, as a worker's main thread's is
        with contextlib.suppress(PermissionError):  # root: start where a worker starts
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        seen["before"] = os.getpriority(os.PRIO_PROCESS, 0)
        priority = Priority()
        priority.yield_cpu()
        seen["yielded"] = os.getpriority(os.PRIO_PROCESS, 0)
        priority.take_back()
        seen["after"] = os.getpriority(os.PRIO_PROCESS, 0)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(30)
    assert seen["yielded"] == max(seen["before"], YIELD_NICE), seen
    if os.geteuid() == 0:
        assert seen["after"] == seen["before"], seen
