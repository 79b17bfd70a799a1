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
