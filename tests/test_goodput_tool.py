"""The run's account leaves the rank: the collector's series, the summary, the command.

The account of a simulated job (tests/goodput_sim.py) is written as the monitoring rank writes
its goodput file; ``ddp-exporter goodput`` reads it back as a table and as JSON, and
``--compare`` is a regression gate with an exit code.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from goodput_sim import Sim
from harness import collected

from exporter import catalog
from exporter.errors import ErrorCounter
from exporter.settings import identity
from exporter.sources.context import RankContext
from exporter.sources.goodput import (
    CATEGORIES,
    GoodputTracker,
    document,
    goodput_path,
    summary_path,
)
from exporter.sources.goodput.ledger import save
from exporter.sources.recorder import Recorder
from exporter.sources.sections import REGISTRY
from exporter.tools import cli

pytestmark = pytest.mark.unit


def _write(folder: Path, run: str, straggle: float) -> str:
    sim = Sim()
    sim.steps(50)
    sim.steps(50, compute={1: straggle} if straggle else None)
    sim.steps(50)
    sim.end()
    blame = sim.account.blame(sim.now, lambda r: f"node-{r}")  # first: it learns the nodes
    doc = document(run=run, world_size=3, state=sim.account.state(sim.now), blame=blame)
    path = goodput_path(str(folder), run)
    save(path, json.dumps(doc))
    return path


def test_the_command_prints_the_file_as_a_table_and_as_json(tmp_path, capsys) -> None:
    path = _write(tmp_path, "a", 0.1)
    assert cli.main(["goodput", "--file", path]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ddp-exporter goodput: run a\n"), text
    for cat in CATEGORIES:
        assert f"\n{cat} " in text, cat
    assert "straggler episode: rank 1 (node node-1), compute" in text, text
    assert cli.main(["goodput", "--file", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"] == "a" and set(doc["totals"]) == set(CATEGORIES)
    assert [(b["category"], b["culprit_rank"]) for b in doc["blame"]] == [("straggler", 1)]


def test_compare_is_a_regression_gate(tmp_path, capsys) -> None:
    healthy, slow = _write(tmp_path, "healthy", 0.0), _write(tmp_path, "slow", 0.2)
    assert cli.main(["goodput", "--compare", healthy, healthy]) == 0
    assert "ok" in capsys.readouterr().out
    assert cli.main(["goodput", "--compare", healthy, slow]) == 1
    out = capsys.readouterr().out
    assert "REGRESSED" in out and "grew most: straggler" in out, out
    # The other way round B gained: no regression.
    assert cli.main(["goodput", "--compare", slow, healthy, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["drop"] < 0 and not found["regressed"]
    # A generous gate lets the slow run through.
    assert cli.main(["goodput", "--compare", healthy, slow, "--max-drop", "0.9"]) == 0


def test_an_unreadable_account_exits_1_with_one_line(tmp_path, capsys) -> None:
    other = tmp_path / "x.json"
    other.write_text('{"not": "an account"}')
    assert cli.main(["goodput", "--file", str(other)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ddp-exporter goodput: ") and err.count("\n") == 1, err
    assert cli.main(["goodput", "--compare", str(other), "no-such-run"]) == 1


class _View:
    def __init__(self, found) -> None:
        self.found = found

    def snapshot(self):
        return self.found


def _scrape(view: _View | None) -> str:
    return collected(Recorder("explicit"), ErrorCounter(), goodput=view)


def test_the_monitoring_rank_publishes_every_category_and_the_blame() -> None:
    totals = dict.fromkeys(CATEGORIES, 0.0) | {"productive": 90.0, "straggler": 6.5}
    text = _scrape(_View((totals, [("straggler", 1, "node-1", 6.5)], 1700000000.0)))
    name = catalog.GOODPUT.name
    for cat in CATEGORIES:
        assert f'{name}{{category="{cat}",rank="0",run="r"}}' in text, cat
    assert f'{name}{{category="productive",rank="0",run="r"}} 90.0' in text
    blame = (
        f'{catalog.GOODPUT_BLAME.name}{{category="straggler",culprit_rank="1",'
        f'node="node-1",rank="0",run="r"}} 6.5'
    )
    assert blame in text, text
    assert f'{catalog.GOODPUT_STARTED.name}{{rank="0",run="r"}} 1.7e+09' in text
    # The other ranks publish none of it.
    for view in (None, _View(None)):
        assert catalog.GOODPUT.name + "{" not in _scrape(view)


class _Aborted:
    """The hang watcher as the account reads it, once the action decided to abort."""

    def __init__(self, unix: float) -> None:
        self.unix = unix

    def latest(self):
        return None

    def aborted(self) -> float | None:
        return self.unix

    def node_of(self, rank: int) -> str:
        return ""


def test_an_abort_ends_the_account_at_the_decision_and_writes_it(tmp_path) -> None:
    now = time.time()
    ctx = RankContext(
        identity=identity(run="r", group=(0, 2), environ={}),
        store=None,
        recorder=Recorder("explicit"),
        sections=REGISTRY,
        interval_s=1.0,
        monitor=True,
        dump_dir=str(tmp_path),
        errors=ErrorCounter(),
    )
    tracker = GoodputTracker(
        ctx,
        hangs=_Aborted(now - 0.5),
        start_unix=now - 10.0,
    )
    tracker.finish(clean=False)  # what the hang watcher's abort calls, before the exit
    tracker.close()
    doc = json.loads(Path(goodput_path(str(tmp_path), "r")).read_text())
    assert doc["ended"] == "aborted" and doc["until_unix"] == pytest.approx(now - 0.5, abs=0.01)
    assert sum(doc["totals"].values()) == pytest.approx(9.5, abs=0.01)
    assert "aborted by the hang action" in Path(summary_path(str(tmp_path), "r")).read_text()
