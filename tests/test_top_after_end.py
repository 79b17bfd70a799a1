"""A top started after a rank ended cleanly, while its peer still saves, calls it finished."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import REPO, Ranks, parse, scrape_text, value, wait_for

from exporter.tools import cli

pytestmark = pytest.mark.job

WORKER = str(Path(REPO) / "tests" / "workers" / "end_skew_worker.py")


def test_top_once_calls_a_rank_that_ended_finished_not_down(tmp_path: Path, capsys) -> None:
    """Its endpoint was gone before top's first read: top called it DOWN, with no number."""
    release = tmp_path / "release"
    with Ranks(2, [WORKER, str(release)]) as ranks:
        try:
            urls = wait_for(lambda: len(ranks.urls) == 2 and ranks.urls, 180, "both endpoints")
            wait_for(lambda: ranks.seen("rank 1: finished"), 120, "rank 1 to end cleanly")
            assert ranks.seen("rank 0: saving") is not None
            wait_for(
                lambda: value(parse(scrape_text(urls[0])), "ddp_peers_ended") == 1,
                30,
                "the monitoring rank to read rank 1's end mark",
            )
            targets = ",".join(u.split("//", 1)[1].split("/", 1)[0] for u in urls.values())
            capsys.readouterr()
            code = cli.main(["top", "--once", "--targets", targets])
            out = capsys.readouterr().out
        finally:
            release.touch()
        assert ranks.wait(timeout=120) == {0: 0, 1: 0}, ranks.output()
    assert code == 0, out
    (line,) = [x for x in out.splitlines() if x.split()[:1] == ["1"]]
    assert "finished: ended cleanly by" in line and "DOWN" not in out, out
