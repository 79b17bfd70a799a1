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

The fast loop is ``-m "unit or tool"``; ``-m "not stack and not lab"`` adds the jobs. How the
tiers share the machine when the suite runs on several workers is tests/scheduling.py's.
"""

from __future__ import annotations

import pytest

__all__ = ["TIERS", "pytest_collection_modifyitems", "pytest_configure", "tier_of", "tiers_of"]

#: Tier -> what it needs (the marker's description in ``pytest --markers``), cheapest first.
TIERS: dict[str, str] = {
    "unit": "in-process only (a one-rank gloo group in the test process counts as in-process)",
    "tool": "runs short commands that exit by themselves: promtool, amtool, the CLI, a build",
    "job": "starts training processes (torchrun, one process per rank, the demo)",
    "stack": "starts a real Prometheus or Alertmanager server (Debian packages)",
    "lab": "the multi-node lab in network namespaces (root; iproute2, nftables, util-linux)",
}


def pytest_configure(config: pytest.Config) -> None:
    """Register the tier markers (with ``--strict-markers`` an unknown one is an error)."""
    for name, text in TIERS.items():
        config.addinivalue_line("markers", f"{name}: tier: {text}")


def tiers_of(item: pytest.Item) -> list[str]:
    """Return the tier markers of ``item`` (function, class and module), sorted, with repeats."""
    return sorted(m.name for m in item.iter_markers() if m.name in TIERS)


def tier_of(item: pytest.Item) -> str:
    """Return the one tier of ``item`` (collected items have exactly one)."""
    return tiers_of(item)[0]


@pytest.hookimpl(tryfirst=True)  # before any other plugin orders or groups the items
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Refuse the collection when a test carries no tier marker or more than one."""
    wrong = [(item.nodeid, tiers_of(item)) for item in items if len(tiers_of(item)) != 1]
    if wrong:
        lines = [f"  {nodeid}: {', '.join(found) or 'no tier'}" for nodeid, found in wrong]
        raise pytest.UsageError(
            f"every test needs exactly one tier marker ({', '.join(TIERS)}; tests/tiers.py):\n"
            + "\n".join(lines)
        )
