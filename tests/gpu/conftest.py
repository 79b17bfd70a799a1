"""Skip every test of this folder, with the reason, where torch sees no CUDA device.

CI has no GPU, so there these tests are reported as skipped; ``scripts/gpu-check.sh`` runs them
(and benchmarks/gpu.py) on a machine with one and writes a report.
"""

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


def missing_cuda() -> str | None:
    """Return why the GPU tests cannot run here, or None when they can."""
    if not torch.cuda.is_available():
        return (
            f"no CUDA device (torch {torch.__version__}, CUDA build: "
            f"{torch.version.cuda or 'none'}); run scripts/gpu-check.sh on a GPU machine"
        )
    return None


def pytest_collection_modifyitems(config, items):
    reason = missing_cuda()
    if reason is None:
        return
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.skip(reason=reason))
