"""DataLoader and optimizer instrumentors on accelerate's wrappers (real objects, one process)."""

import pytest
import torch

from exporter.errors import ErrorCounter
from exporter.sources.instrumentors import DataLoaderInstrumentor, OptimizerInstrumentor
from exporter.sources.recorder import Recorder

pytestmark = pytest.mark.unit

accelerate = pytest.importorskip("accelerate")


def test_accelerate_wrappers_are_timed_and_restored():
    acc = accelerate.Accelerator(cpu=True)
    net = torch.nn.Linear(4, 1)
    data = torch.utils.data.TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
    model, opt, loader = acc.prepare(
        net, torch.optim.SGD(net.parameters(), lr=0.1), torch.utils.data.DataLoader(data, 4)
    )
    real_type = type(loader)  # DataLoaderShard, whose __class__ property says DataLoader
    rec, errors = Recorder("optimizer"), ErrorCounter()
    dl, op = DataLoaderInstrumentor(loader, rec, errors), OptimizerInstrumentor(opt, rec, errors)
    dl.instrument()
    op.instrument()
    assert op.optimizer is opt.optimizer  # the optimizer whose step() really runs
    for x, y in loader:
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    snap = rec.snapshot()
    assert snap.steps == 3 and snap.phase_sum[0] > 0.0, snap
    dl.uninstrument()
    op.uninstrument()
    assert type(loader) is real_type and isinstance(loader, torch.utils.data.DataLoader)
    assert not opt.optimizer._optimizer_step_pre_hooks
    assert errors.snapshot() == dict.fromkeys(errors.snapshot(), 0)
