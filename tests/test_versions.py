"""exporter.sources.versions: the versions every rank publishes on ddp_rank_info for DDPVersionSkew."""

from __future__ import annotations

import platform

import pytest
import torch
from harness import parse, scrape_text

import exporter
from exporter import catalog
from exporter.sources.versions import versions

pytestmark = pytest.mark.unit


def test_versions_name_torch_python_cuda_and_nccl() -> None:
    v = versions()
    assert set(v) == set(catalog.VERSION_LABELS)
    assert v["torch_version"] == torch.__version__
    assert v["python_version"] == platform.python_version()
    if torch.version.cuda is None:  # this CPU build: no CUDA, no NCCL
        assert (v["cuda_version"], v["nccl_version"]) == ("none", "none")
    else:
        assert v["cuda_version"] == torch.version.cuda


def test_rank_info_carries_the_versions(ddp) -> None:
    model, _, _ = ddp
    obs = exporter.instrument(model, port=0, addr="127.0.0.1")
    s = parse(scrape_text(f"http://127.0.0.1:{obs.port}/metrics"))
    ((labels, one),) = s["ddp_rank_info"]
    assert one == 1.0
    assert {k: labels[k] for k in catalog.VERSION_LABELS} == versions()
    assert set(catalog.RANK_INFO.labels) <= set(labels)
