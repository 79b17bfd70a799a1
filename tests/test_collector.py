"""Exposition format: parses, passes promtool, stays within the documented series budget."""

import shutil
import subprocess

import pytest
from conftest import train_epoch
from harness import parse, scrape_text

import exporter
from exporter import catalog


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


@pytest.mark.unit
def test_series_count_matches_the_documented_formula(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, dataloader=loader, optimizer=opt, port=0, addr="127.0.0.1")
    train_epoch(model, loader, opt)
    text = scrape_text(f"http://127.0.0.1:{obs.port}/metrics")
    expected = catalog.series_per_rank(process_groups=1, monitor=True, world_size=1)
    assert _series(text) == expected
    assert expected <= 150
    names = {s for s in parse(text)}
    assert all(n.startswith("ddp_") for n in names)


@pytest.mark.tool
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_check_metrics_passes(ddp):
    model, loader, opt = ddp
    obs = exporter.instrument(model, dataloader=loader, optimizer=opt, port=0, addr="127.0.0.1")
    train_epoch(model, loader, opt)
    text = scrape_text(f"http://127.0.0.1:{obs.port}/metrics")
    res = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
