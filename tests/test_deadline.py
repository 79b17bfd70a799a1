"""exporter.deadline (exporter.sources.sections): named sections, their bounds, nesting and threads, and what a scrape shows."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import train_epoch
from harness import parse, scrape_text, value, wait_for

import exporter
from exporter import catalog
from exporter.sources.sections import MAX_SECTIONS, REGISTRY, SectionRegistry, deadline

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _clean_registry():
    """The registry is process-wide: leave it empty for the other tests of this process."""
    REGISTRY.clear()
    yield
    REGISTRY.clear()


def _state(reg: SectionRegistry, name: str):
    (state,) = [s for s in reg.snapshot() if s.name == name]
    return state


def test_with_block_publishes_start_while_running_then_duration() -> None:
    reg = SectionRegistry()
    section = deadline("checkpoint", seconds=600, registry=reg)
    idle = _state(reg, "checkpoint")
    assert (idle.deadline_s, idle.runs, idle.last_duration_s, idle.started_unix) == (
        600.0,
        0,
        None,
        None,
    )
    before = time.time()
    with section:
        running = _state(reg, "checkpoint")
        assert before <= running.started_unix <= time.time()
        assert running.runs == 0
    done = _state(reg, "checkpoint")
    assert done.started_unix is None and done.runs == 1
    assert 0 <= done.last_duration_s < 5


def test_decorator_counts_every_call_and_lets_exceptions_through() -> None:
    reg = SectionRegistry()

    @deadline("eval", seconds=10, registry=reg)
    def evaluate(fail: bool) -> str:
        if fail:
            raise KeyError("boom")
        return "ok"

    assert evaluate(False) == "ok"
    with pytest.raises(KeyError, match="boom"):
        evaluate(True)
    state = _state(reg, "eval")
    assert state.runs == 2 and state.started_unix is None


def test_nested_and_concurrent_runs_publish_the_run_due_first() -> None:
    reg = SectionRegistry()
    outer = deadline("save", seconds=100, registry=reg)
    with outer:
        first_start = _state(reg, "save").started_unix
        # Same name, shorter deadline, nested: it is due first, so it is the one published.
        with deadline("save", seconds=1, registry=reg):
            nested = _state(reg, "save")
            assert nested.deadline_s == 1.0 and nested.started_unix >= first_start
        back = _state(reg, "save")
        assert (back.deadline_s, back.started_unix, back.runs) == (100.0, first_start, 1)
        # Reusing the same object in another thread while this thread's run is open.
        entered, release = threading.Event(), threading.Event()

        def other() -> None:
            with outer:
                entered.set()
                release.wait(10)

        t = threading.Thread(target=other)
        t.start()
        assert entered.wait(10)
        assert _state(reg, "save").started_unix == first_start  # the older run is due first
        release.set()
        t.join(10)
        assert _state(reg, "save").runs == 2
    assert _state(reg, "save").runs == 3 and _state(reg, "save").started_unix is None


@pytest.mark.parametrize("name", ["", "has space", "1st", "a-b", "x" * 33, "step/1", None, 42])
def test_names_that_are_not_short_identifiers_are_rejected(name) -> None:
    with pytest.raises(ValueError, match="short identifier"):
        deadline(name, seconds=1, registry=SectionRegistry())


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf")])
def test_non_positive_deadlines_are_rejected(seconds) -> None:
    with pytest.raises(ValueError, match="positive finite"):
        deadline("ok", seconds=seconds, registry=SectionRegistry())


@pytest.mark.parametrize("seconds", ["60", True, None])
def test_non_numeric_deadlines_are_rejected(seconds) -> None:
    with pytest.raises(TypeError, match="expected a number"):
        deadline("ok", seconds=seconds, registry=SectionRegistry())


def test_more_than_the_cap_of_distinct_names_is_rejected_but_known_names_stay_usable() -> None:
    reg = SectionRegistry()
    for i in range(MAX_SECTIONS):
        deadline(f"part_{i}", seconds=1, registry=reg)
    with pytest.raises(ValueError, match=f"at most {MAX_SECTIONS} distinct section names"):
        deadline("one_too_many", seconds=1, registry=reg)
    with deadline("part_0", seconds=2, registry=reg):  # a known name is not a new label value
        pass
    assert len(reg.snapshot()) == MAX_SECTIONS


def test_sections_entered_before_instrument_are_served_after_it(ddp) -> None:
    model, loader, opt = ddp
    entered, release = threading.Event(), threading.Event()

    def checkpoint() -> None:
        with exporter.deadline("checkpoint", seconds=0.5):
            entered.set()
            release.wait(30)

    t = threading.Thread(target=checkpoint)
    t.start()
    try:
        assert entered.wait(10)
        with exporter.deadline("eval", seconds=30):
            pass
        obs = exporter.instrument(
            model, dataloader=loader, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0
        )
        url = f"http://127.0.0.1:{obs.port}/metrics"
        s = parse(scrape_text(url))
        assert value(s, "ddp_section_deadline_seconds", section="checkpoint") == 0.5
        assert value(s, "ddp_section_started_timestamp_seconds", section="checkpoint") > 0
        assert value(s, "ddp_section_runs_total", section="checkpoint") == 0
        assert value(s, "ddp_section_runs_total", section="eval") == 1
        assert value(s, "ddp_section_last_duration_seconds", section="eval") < 30
        assert value(s, "ddp_exporter_errors_total", where="section") == 0
    finally:
        release.set()
        t.join(30)
    train_epoch(model, loader, opt)
    s = wait_for(
        lambda: (
            (s := parse(scrape_text(url)))
            and value(s, "ddp_section_runs_total", section="checkpoint") == 1
            and s
        ),
        10,
        "the checkpoint run to be counted",
    )
    # Finished: no start time any more, its duration (over its deadline) is kept.
    assert not [lab for lab, _ in s.get("ddp_section_started_timestamp_seconds", [])]
    assert value(s, "ddp_section_last_duration_seconds", section="checkpoint") > 0
    assert value(s, "ddp_section_ended_timestamp_seconds", section="eval") > 0
    # The documented budget: 5 per section at most; neither runs, and the checkpoint has an end
    # time only if it ended within its deadline.
    ended = {lab["section"] for lab, _ in s.get("ddp_section_ended_timestamp_seconds", [])}
    text = scrape_text(url)
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    expected = catalog.series_per_rank(process_groups=1, sections=2, store_heartbeat=False)
    assert series == expected - 2 - (2 - len(ended))


def test_only_a_run_within_its_deadline_leaves_an_end_time() -> None:
    """The wait of the ranks a section held up counts from its end; an overdue end excuses
    nothing after it, so it leaves none."""
    reg = SectionRegistry()
    before = time.time()
    with deadline("eval", seconds=60, registry=reg):
        pass
    with deadline("save", seconds=0.01, registry=reg):
        time.sleep(0.05)
    ended = {s.name: s.ended_unix for s in reg.snapshot()}
    assert ended["eval"] is not None and before <= ended["eval"] <= time.time()
    assert ended["save"] is None


def test_exporter_failures_inside_a_section_never_reach_the_user_and_are_counted() -> None:
    reg = SectionRegistry(max_sections=1)
    old = deadline("old", seconds=5, registry=reg)
    with old:
        reg.clear()  # forgotten while running: its end is not an error
    assert reg.errors.snapshot()["section"] == 0
    deadline("new", seconds=5, registry=reg)  # takes the only slot
    ran = []
    with old:  # cannot be re-registered: the body still runs, the error is counted
        ran.append(True)
    assert ran == [True]
    assert reg.errors.snapshot()["section"] == 1
    assert [s.name for s in reg.snapshot()] == ["new"]


class _Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def section_begin(self) -> None:
        self.calls.append(("begin", threading.get_ident()))

    def section_end(self) -> None:
        self.calls.append(("end", threading.get_ident()))


def test_busy_while_a_section_runs_within_its_deadline_and_listeners_hear_of_it() -> None:
    reg = SectionRegistry()
    listener = _Listener()
    reg.listen(listener)
    section = deadline("checkpoint", seconds=60, registry=reg)
    assert reg.busy() is None
    with section:
        assert reg.busy() == "checkpoint"
        # Past its deadline the section no longer excuses the rank (the hang logic applies).
        assert reg.busy(now_mono=time.monotonic() + 61) is None
    assert reg.busy() is None
    here = threading.get_ident()
    assert listener.calls == [("begin", here), ("end", here)]
    reg.unlisten(listener)
    with section:
        pass
    assert len(listener.calls) == 2


def test_a_failing_listener_is_counted_and_the_section_still_runs() -> None:
    reg = SectionRegistry()

    class Broken:
        def section_begin(self) -> None:
            raise RuntimeError("boom")

        def section_end(self) -> None:
            raise RuntimeError("boom")

    reg.listen(Broken())
    ran = []
    with deadline("eval", seconds=60, registry=reg):
        ran.append(True)
    assert ran and _state(reg, "eval").runs == 1
    assert reg.errors.snapshot()["section"] == 2


def test_a_section_that_just_ended_still_excuses_for_a_grace_period() -> None:
    reg = SectionRegistry()
    with deadline("checkpoint", seconds=60, registry=reg):
        pass
    now = time.monotonic()
    assert reg.busy(now_mono=now) is None
    assert reg.busy(now_mono=now, grace_s=5) == "checkpoint"
    assert reg.busy(now_mono=now + 6, grace_s=5) is None
