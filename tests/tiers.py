"""Test tiers: every test carries exactly one marker saying what it costs and what it needs.

A pytest plugin (loaded by tests/conftest.py): it registers the tier markers and refuses a
collection in which a test carries none or several, naming each such test, so that a new test
cannot forget its tier. The tiers, cheapest first:

``unit``
    In-process only (a one-rank gloo group in the test process counts as in-process).
``tool``
    Runs short commands that exit by themselves: promtool, amtool, the CLI, a wheel build.
``job``
    Starts training processes: torchrun, one process per rank, the demo.
``stack``
    Starts a real Prometheus or Alertmanager server (Debian packages), mostly with jobs.
``lab``
    The multi-node lab in network namespaces (root; iproute2, nftables, util-linux).

The fast loop is ``-m "unit or tool"``; ``-m "not stack and not lab"`` adds the jobs.

The plugin also orders the collection by tier, costliest first (lab, stack, job, tool, unit): a
module runs where its costliest test puts it, its tests kept together so that a module-scoped
fixture is set up once. With several workers (pytest-xdist) the long drills start at once and
the short tests fill the gaps after them, instead of one long drill starting last and running
alone at the end. The lab's tests run one after another on one worker (:data:`SERIAL`): they
share the root namespace's links and measure bandwidth.
"""

from __future__ import annotations

import pytest

__all__ = [
    "ORDER",
    "SERIAL",
    "TIERS",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "tiers_of",
]

#: Tier -> what it needs (the marker's description in ``pytest --markers``).
TIERS: dict[str, str] = {
    "unit": "in-process only (a one-rank gloo group in the test process counts as in-process)",
    "tool": "runs short commands that exit by themselves: promtool, amtool, the CLI, a build",
    "job": "starts training processes (torchrun, one process per rank, the demo)",
    "stack": "starts a real Prometheus or Alertmanager server (Debian packages)",
    "lab": "the multi-node lab in network namespaces (root; iproute2, nftables, util-linux)",
}


#: The order the tiers run in: costliest first.
ORDER = ("lab", "stack", "job", "tool", "unit")

#: Tiers whose tests run one at a time, on one xdist worker (``--dist loadgroup``).
SERIAL = ("lab",)


def pytest_configure(config: pytest.Config) -> None:
    """Register the tier markers (with ``--strict-markers`` an unknown one is an error)."""
    for name, text in TIERS.items():
        config.addinivalue_line("markers", f"{name}: tier: {text}")
    # pytest-xdist registers it too; without xdist the group is just a label.
    config.addinivalue_line("markers", "xdist_group(name): run on the worker of this group")


def tiers_of(item: pytest.Item) -> list[str]:
    """Return the tier markers of ``item`` (function, class and module), sorted, with repeats."""
    return sorted(m.name for m in item.iter_markers() if m.name in TIERS)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Refuse a test with no tier marker or more than one; order the rest costliest first."""
    wrong = [(item.nodeid, tiers_of(item)) for item in items if len(tiers_of(item)) != 1]
    if wrong:
        lines = [f"  {nodeid}: {', '.join(found) or 'no tier'}" for nodeid, found in wrong]
        raise pytest.UsageError(
            f"every test needs exactly one tier marker ({', '.join(TIERS)}; tests/tiers.py):\n"
            + "\n".join(lines)
        )
    cost: dict[str, int] = {}
    for item in items:
        if tiers_of(item)[0] in SERIAL:
            item.add_marker(pytest.mark.xdist_group(tiers_of(item)[0]))
        module = item.nodeid.split("::")[0]
        cost[module] = min(cost.get(module, len(ORDER)), ORDER.index(tiers_of(item)[0]))
    # A stable sort: every xdist worker computes the same order, as it must.
    items.sort(key=lambda item: cost[item.nodeid.split("::")[0]])
