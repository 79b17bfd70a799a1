"""A clean end is published and read before exit; a crash is not a clean end."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from conftest import train_epoch
from harness import REPO, child_env, parse, wait_for

import exporter
from exporter.export.server import Scrapers
from exporter.sources import ending


@pytest.mark.unit
def test_ending_cleanly_unless_an_exception_propagates():
    assert ending.ending_cleanly()
    seen = []
    with pytest.raises(ValueError):
        try:
            raise ValueError("training failed")
        finally:
            seen.append(ending.ending_cleanly())
    try:
        sys.exit(0)
    except SystemExit:
        seen.append(ending.ending_cleanly())
    try:
        sys.exit(3)
    except SystemExit:
        seen.append(ending.ending_cleanly())
    assert seen == [False, True, False]


@pytest.mark.tool
@pytest.mark.parametrize(
    ("end", "clean"),
    [("pass", True), ("raise RuntimeError('boom')", False), ("sys.exit(0)", True)],
)
def test_exiting_cleanly_at_interpreter_exit(end, clean):
    code = (
        "import atexit, sys\n"
        "from exporter.sources.ending import exiting_cleanly\n"
        "atexit.register(lambda: print('clean', exiting_cleanly(), flush=True))\n" + end
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=child_env(),
    )
    assert f"clean {clean}" in res.stdout, res.stdout + res.stderr


@pytest.mark.unit
def test_waiting_for_a_final_scrape_waits_for_recent_scrapers_only():
    # Real time plus an offset the test moves on: scrapes a second apart take no second, and
    # no scheduling delay of a scraping thread on a busy machine decides the outcome.
    offset = [0.0]
    scrapers = Scrapers(clock=lambda: time.monotonic() + offset[0])

    def scrape(who: str) -> None:
        scrapers.answered(who, scrapers.scraped(who))

    assert scrapers.wait_after(scrapers.now(), cap=5.0) == (True, 0.0)  # nobody scrapes
    scrape("old")
    scrape("old")  # its interval is a few microseconds: soon not recent any more
    offset[0] += 1.0
    scrape("prometheus")
    offset[0] += 1.0
    scrape("prometheus")  # every second
    offset[0] += 0.5
    assert scrapers.recent(scrapers.now()) == ["prometheus"]
    since, result = scrapers.now(), []
    waiter = threading.Thread(target=lambda: result.append(scrapers.wait_after(since, 5.0)))
    waiter.start()
    offset[0] += 0.2
    started = scrapers.scraped("prometheus")  # its next scrape, whether the waiter waits or not
    # Begun is not read: a process that exits now would cut the answer off.
    assert not scrapers.wait_after(since, cap=0.0)[0]
    scrapers.answered("prometheus", started)
    waiter.join(10)
    assert result and result[0][0] and result[0][1] < 1.0, result
    # A scraper that stopped is waited for 1.5 of its intervals at most, then given up on.
    came, waited = scrapers.wait_after(scrapers.now(), cap=5.0)
    assert not came and 0.5 < waited < 5.0, waited


#: The scraper's period: close() waits for its next scrape up to 1.5 periods after its last, so
#: a scrape later than half a period misses the final state. At 0.2 s a loaded 2-core machine
#: delayed one past that (0.1 s of slack); at 1 s the slack is 0.5 s.
SCRAPE_EVERY_S = 1.0


def _scraper(url: str, stop: threading.Event, seen: list[str]) -> None:
    while not stop.wait(SCRAPE_EVERY_S):
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                seen.append(resp.read().decode())
        except OSError:
            return


@pytest.mark.unit
def test_a_clean_close_is_scraped_before_the_endpoint_goes(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0)
    train_epoch(model, loader, opt)
    stop, seen = threading.Event(), []
    thread = threading.Thread(target=_scraper, args=(obs.url, stop, seen), daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(seen) >= 3, 30, "three scrapes")
        t0 = time.monotonic()
        obs.close()
        took = time.monotonic() - t0
    finally:
        stop.set()
        thread.join()
    finals = [parse(text).get("ddp_finished_timestamp_seconds") for text in seen]
    assert finals[-1] and finals[-1][0][1] == pytest.approx(time.time(), abs=30)
    assert not finals[0]
    assert took < 2.0, took  # up to one scrape period (1 s), never the cap


@pytest.mark.unit
def test_close_while_an_error_propagates_is_no_clean_end(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0)
    with pytest.raises(RuntimeError):
        try:
            raise RuntimeError("training failed")
        finally:
            obs.close()
    assert obs.end.unix is None
