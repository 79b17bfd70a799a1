"""The demo trainer's announcements, as read by the CLI and the test harness."""

from __future__ import annotations

import sys

import pytest

from exporter.tools import demo
from exporter.tools.demo import metrics_urls

pytestmark = pytest.mark.unit


def test_announcements_glued_together_by_a_shared_pipe_are_all_found():
    # Seen in CI: two ranks' prints interleaved into one line under torchrun.
    text = "rank 1: metrics at http://127.0.0.1:38823/metricsrank 0: metrics at http://127.0.0.1:37589/metrics\n"
    assert metrics_urls(text) == {
        0: "http://127.0.0.1:37589/metrics",
        1: "http://127.0.0.1:38823/metrics",
    }


def test_an_unserved_rank_is_not_taken_for_a_url():
    assert metrics_urls("rank 0: metrics at None\n") == {}


class _Writes:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return len(s)

    def flush(self) -> None:
        pass


def test_each_announcement_is_one_write(monkeypatch):
    # A single write(2) below PIPE_BUF is atomic, so ranks sharing a pipe cannot split a line
    # (print() writes the text and the newline separately).
    out = _Writes()
    monkeypatch.setattr(sys, "stdout", out)
    demo.say("rank 3: metrics at http://127.0.0.1:1/metrics")
    assert out.calls == ["rank 3: metrics at http://127.0.0.1:1/metrics\n"]


def test_a_hung_demo_job_ends_a_minute_after_its_hang_with_or_without_the_stack():
    """Without Prometheus the hang demo waited out gloo's 30-minute timeout, whatever
    ``--duration`` said: a rank inside a collective never reaches its end of training."""
    from exporter.tools.cli import build_parser

    def timeout(duration: float, use_stack: bool) -> str | None:
        args = build_parser().parse_args(
            ["demo", "--fault", "hang", "--duration", str(duration), "--port", "0"]
        )
        cmd = demo._commands(args, None, use_stack)[0][0]
        return cmd[cmd.index("--timeout") + 1] if "--timeout" in cmd else None

    assert timeout(30, use_stack=False) == timeout(30, use_stack=True) == "60"
    assert timeout(0, use_stack=False) is None  # until Ctrl-C: the watcher's own time


def test_the_demo_shows_its_ranks_and_errors_not_torchruns_account_of_a_fault():
    for line in (
        "rank 0: collective failed (Connection closed by peer); still serving metrics",
        "rank 1: injecting fault hang",
        "ddp-exporter hangs:   rank 1 (node vm) never entered all_reduce #111 (pg 0)",
        "ModuleNotFoundError: No module named 'yaml'",
    ):
        assert demo.shown(line), line
    for line in (  # what torchrun prints as the fault's expected end takes the job down
        '  File "/x/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367',
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "step 52 loss 0.31",
    ):
        assert not demo.shown(line), line
