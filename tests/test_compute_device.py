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


def test_without_a_model_the_collectives_device_is_nccls_gpu():
    """A loop of collectives (no model, or one without parameters) on NCCL computes on the
    current GPU: its collectives return once enqueued, as a CUDA model's do."""
    for backend in ("nccl", "cpu:gloo,cuda:nccl"):
        on = compute_device(None, current_cuda=lambda: 2, backend=lambda b=backend: b)
        assert on == torch.device("cuda", 2), backend
    relu = compute_device(torch.nn.ReLU(), current_cuda=lambda: 1, backend=lambda: "nccl")
    assert relu == torch.device("cuda", 1)
    for backend, gpu in (("gloo", 2), ("", 2), ("nccl", None)):
        on = compute_device(None, current_cuda=lambda g=gpu: g, backend=lambda b=backend: b)
        assert on == torch.device("cpu"), (backend, gpu)


def test_a_loop_on_gloo_computes_on_the_cpu(world1):
    assert compute_device(None, current_cuda=lambda: 3) == torch.device("cpu")
