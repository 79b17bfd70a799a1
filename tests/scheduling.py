"""Share one machine between the suite's workers: costliest tests first, groups, solo tests.

A pytest plugin (loaded by tests/conftest.py after :mod:`tiers`). Most of the suite's time is
spent waiting on alert windows and on training steps that sleep, so it runs on several
pytest-xdist workers (``--dist loadgroup``, see pyproject.toml). Three rules keep that both
fast and honest:

- **Costliest first.** The collection is ordered by tier (lab, stack, job, tool, unit), a
  module where its costliest test puts it, its tests kept together so that a module-scoped
  fixture is set up once: the long drills start at once and the short tests fill in behind
  them, instead of one long drill starting last and running alone at the end.
- **Groups.** The lab's tests run one after another on one worker (they share the root
  namespace's bridge); a test that needs a fixed resource (the default ports) names a group of
  its own with ``pytest.mark.xdist_group``. The tests of a module that share a module-scoped
  fixture (a job, a stack, a venv) run on one worker too, so that the fixture is set up once
  rather than once on each worker that draws one of them.
- **Solo tests.** A test marked ``solo`` asserts something about timing on a healthy job (no
  alert even pending over minutes; a link's bandwidth) that another job's CPU load on the same
  cores would falsify: it runs while no other ``job``, ``stack`` or ``lab`` test runs. Every such
  test holds a shared lock while it runs and a solo test the exclusive one (``flock`` on files
  in a folder the controller makes for the run); a solo test waiting keeps new shared holders
  out, so it waits only for the tests already running. The solo tests run as one block: one
  group (``solo``), so one worker, holding the exclusive lock from the first to the last, so
  that the costly tests drain once rather than before each. The block begins once every
  shared test of the run has ended (each one that ends is counted in the lock folder): a
  worker draws its next tests before it runs them, and one it drew behind the block would
  otherwise wait for the whole block, then run alone at the end of the run.
- **Fast tiers in the gaps.** The solo block comes after the costly tests and before the
  modules that hold only ``unit`` and ``tool`` tests. A worker runs those at the lowest CPU
  priority (nice 19), so they use the cores the solo tests leave idle (about half of them: the
  drills' ranks mostly sleep) as a busy loop at that priority would, the load the solo tests
  must stand anyway, instead of running alone after the block. A worker never runs a costly
  test after them (they come last); where one would, it takes its priority back first where
  the system lets it (root).

Without xdist (``-n 0``) every test runs alone anyway and nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiers import TIERS, tier_of

__all__ = [
    "LOCKS",
    "ORDER",
    "SERIAL",
    "SHARING",
    "SOLO_GROUP",
    "SOLO_PATIENCE_S",
    "YIELD_NICE",
    "Priority",
    "SoloBlock",
    "Tally",
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_runtest_protocol",
    "pytest_unconfigure",
    "turn",
]

#: The order the tiers run in: costliest first.
ORDER = ("lab", "stack", "job", "tool", "unit")
assert set(ORDER) == set(TIERS)

#: Tiers whose tests run one after another on one worker (``--dist loadgroup``).
SERIAL = ("lab",)

#: Tiers whose tests share the machine with each other but never with a solo test.
SHARING = ("lab", "stack", "job")

#: The variable naming the run's lock folder; the controller sets it before it starts workers.
LOCKS = "DDP_EXPORTER_TEST_LOCKS"

#: The xdist group of every solo test (one worker runs them one after another).
SOLO_GROUP = "solo"

#: The nice value a worker runs the fast modules' tests at, beside the solo block.
YIELD_NICE = 19

#: Seconds without a shared test ending after which the solo block stops waiting for the rest
#: (a test whose worker crashed never ends); longer than any one test takes.
SOLO_PATIENCE_S = 600.0

#: The number of shared tests (the ``SHARING`` tiers' tests, not solo) in the session.
_SHARED = pytest.StashKey[int]()

#: Tests that yield the CPU: those of the modules holding only fast tiers (not solo).
_YIELDS = pytest.StashKey[bool]()

#: The lock folder this session made (a controller's): only its maker removes it.
_MADE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Register ``solo``; on the controller of a parallel run, make the run's lock folder."""
    config.addinivalue_line(
        "markers", "solo: runs while no other job, stack or lab test runs (tests/scheduling.py)"
    )
    config.addinivalue_line("markers", "xdist_group(name): run on the worker of this group")
    workers = getattr(config.option, "numprocesses", None)
    if not hasattr(config, "workerinput") and workers:
        folder = tempfile.mkdtemp(prefix="ddp-exporter-test-locks-")
        config.stash[_MADE] = os.environ[LOCKS] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the run's lock folder, where this session made it (workers have ended by now).

    Not otherwise: a pytest run inside a test (pytester) inherits the variable and loads this
    plugin too, and must leave the outer run's folder and its workers' locks alone.
    """
    folder = config.stash.get(_MADE, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get(LOCKS) == folder:
            del os.environ[LOCKS]


def _solo(item: pytest.Item) -> bool:
    return item.get_closest_marker("solo") is not None


def _module_fixture(item: pytest.Item) -> bool:
    """Say whether ``item`` uses a module-scoped fixture (its module's tests share one)."""
    info = getattr(item, "_fixtureinfo", None)  # pytest.Function's; other items have none
    if info is None:
        return False
    return any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values() if defs)


# First: pytest-xdist's own hook turns a test's xdist_group marker into its nodeid's "@group"
# suffix, which is what --dist loadgroup schedules by; registered after this conftest plugin, it
# would otherwise run first and never see the groups added here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Group the serial tiers' tests; order every test costliest first, solo tests last."""
    cost: dict[str, float] = {}
    for item in items:
        if _solo(item):
            if item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(SOLO_GROUP))
        elif tier_of(item) in SERIAL:
            item.add_marker(pytest.mark.xdist_group(tier_of(item)))
        elif _module_fixture(item) and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        module = item.nodeid.split("::")[0]
        cost[module] = min(cost.get(module, len(ORDER)), ORDER.index(tier_of(item)))

    fast = ORDER.index("tool")

    def key(item: pytest.Item) -> float:
        # After the costly tests, before the modules of fast tests only: see the docstring.
        return fast - 0.5 if _solo(item) else cost[item.nodeid.split("::")[0]]

    for item in items:
        item.stash[_YIELDS] = key(item) >= fast
    # A stable sort: every xdist worker computes the same order, as it must.
    items.sort(key=key)


def _shared(item: pytest.Item) -> bool:
    return not _solo(item) and tier_of(item) in SHARING


def pytest_collection_finish(session: pytest.Session) -> None:
    """Count the session's shared tests (after deselection: what every worker runs between them)."""
    session.config.stash[_SHARED] = sum(1 for item in session.items if _shared(item))


class Tally:
    """The run's count of ended shared tests: a file in the lock folder, a byte per test."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "ended"

    def add(self) -> None:
        """Count one more ended test (an appended byte: atomic, whichever worker writes it)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)

    def count(self) -> int:
        """Return how many shared tests have ended so far."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def wait(self, total: int, patience: float = SOLO_PATIENCE_S, poll: float = 0.5) -> bool:
        """Wait until ``total`` tests have ended; False once none ended for ``patience`` s."""
        seen, since = self.count(), time.monotonic()
        while seen < total:
            if time.monotonic() - since > patience:
                return False
            time.sleep(poll)
            now = self.count()
            if now != seen:
                seen, since = now, time.monotonic()
        return True


@contextlib.contextmanager
def turn(folder: Path, exclusive: bool) -> Iterator[None]:
    """Hold the run's lock, shared or exclusive, until the block ends; a writer waits first.

    Two locks: whoever wants the room passes the turnstile first. A solo test keeps the
    turnstile while it waits for the room, so no new shared holder gets in meanwhile.
    """
    with open(folder / "turnstile", "a") as gate, open(folder / "room", "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)


class SoloBlock:
    """The exclusive lock, held from one solo test to the next while they follow each other."""

    def __init__(self) -> None:
        self._held: contextlib.ExitStack | None = None

    @property
    def held(self) -> bool:
        return self._held is not None

    def enter(self, folder: Path) -> None:
        """Take the exclusive lock unless this block holds it already."""
        if self._held is None:
            stack = contextlib.ExitStack()
            stack.enter_context(turn(folder, exclusive=True))
            self._held = stack

    def leave(self, next_is_solo: bool) -> None:
        """Give the lock back unless the next test on this worker is solo too."""
        if self._held is not None and not next_is_solo:
            held, self._held = self._held, None
            held.close()


_block = SoloBlock()


class Priority:
    """This worker's CPU priority: lowered for the fast tests, taken back where allowed."""

    def __init__(self) -> None:
        self._before: int | None = None

    def yield_cpu(self) -> None:
        """Run at :data:`YIELD_NICE` from now on (the calling thread and what it starts)."""
        if self._before is None:
            self._before = os.getpriority(os.PRIO_PROCESS, 0)
            os.setpriority(os.PRIO_PROCESS, 0, max(self._before, YIELD_NICE))

    def take_back(self) -> None:
        """Run at the priority from before :meth:`yield_cpu`, where the system allows it."""
        if self._before is not None:
            with contextlib.suppress(PermissionError):  # raising it takes root
                os.setpriority(os.PRIO_PROCESS, 0, self._before)
                self._before = None


_priority = Priority()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Run a costly test under the shared lock, a run of solo tests under the exclusive one."""
    folder = os.environ.get(LOCKS)
    if not folder or not hasattr(item.config, "workerinput"):
        return (yield)
    if item.stash.get(_YIELDS, False):
        _priority.yield_cpu()
    else:
        _priority.take_back()
    if not _solo(item):
        if tier_of(item) not in SHARING:
            return (yield)
        try:
            with turn(Path(folder), exclusive=False):
                return (yield)
        finally:
            Tally(Path(folder)).add()
    if not _block.held:
        Tally(Path(folder)).wait(item.config.stash.get(_SHARED, 0))
    _block.enter(Path(folder))
    try:
        return (yield)
    finally:
        _block.leave(next_is_solo=nextitem is not None and _solo(nextitem))
