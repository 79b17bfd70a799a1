"""The device a model computes and communicates on, which decides the CUDA paths."""

from __future__ import annotations

import types

import pytest
import torch

from exporter.sources.parallelism import compute_device

pytestmark = pytest.mark.unit


class Offloaded:
    """A model whose first parameter is a DTensor shard resting on the CPU over a CUDA mesh,
    as FSDP2's CPUOffloadPolicy leaves it (a CUDA mesh cannot exist here)."""

    def parameters(self):
        mesh = types.SimpleNamespace(device_type="cuda")
        yield types.SimpleNamespace(device=torch.device("cpu"), device_mesh=mesh)


def test_a_model_computes_where_its_parameters_are():
    assert compute_device(None) == torch.device("cpu")
    assert compute_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert compute_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameter


def test_fsdp2_shards_offloaded_to_the_cpu_compute_on_the_current_gpu():
    assert compute_device(Offloaded(), current_cuda=lambda: 3) == torch.device("cuda", 3)
    assert compute_device(Offloaded(), current_cuda=lambda: None) == torch.device("cpu")


def test_fsdp2_on_a_cpu_mesh_computes_on_the_cpu(world1):
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(torch.nn.Linear(4, 4))
    assert next(model.parameters()).device_mesh.device_type == "cpu"
    assert compute_device(model, current_cuda=lambda: 3) == torch.device("cpu")
