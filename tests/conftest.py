import atexit
import datetime
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Hang faults make ranks write forensics dumps (./ddp-exporter-dumps by default): keep the
# checkout clean by sending every test job's dumps to a folder removed at the end.
if "DDP_EXPORTER_DUMP_DIR" not in os.environ:
    os.environ["DDP_EXPORTER_DUMP_DIR"] = tempfile.mkdtemp(prefix="ddp-exporter-test-dumps-")
    atexit.register(shutil.rmtree, os.environ["DDP_EXPORTER_DUMP_DIR"], True)

# Nothing a test starts may outlive the session: these hooks tag and then check every process,
# and a session ended by SIGTERM or SIGHUP unwinds like Ctrl-C.
from leftovers import (  # noqa: E402, F401
    pytest_configure,
    pytest_configure_node,
    pytest_runtest_setup,
    pytest_sessionfinish,
    unwind_on_signals,
)

unwind_on_signals()


def pytest_unconfigure(config: pytest.Config) -> None:
    """At the session's end, remove the labs of workers killed inside one (a SIGTERM).

    Only labs whose process is gone: a lab of another session still running is left alone.
    """
    if hasattr(config, "workerinput") or os.geteuid() != 0 or shutil.which("ip") is None:
        return
    from lab import clean_leftovers

    clean_leftovers()


# Every test carries exactly one tier marker (unit, tool, job, stack, lab): registered and
# checked; the workers of a parallel run share the machine by tests/scheduling.py's rules.
pytest_plugins = ["tiers", "scheduling"]


@pytest.fixture(scope="session")
def world1():
    """A real one-rank gloo process group in the test process."""
    import torch.distributed as dist
    from harness import free_port

    if not dist.is_initialized():
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{free_port()}",
            rank=0,
            world_size=1,
            timeout=datetime.timedelta(seconds=60),
        )
    yield dist
    dist.destroy_process_group()


@pytest.fixture
def ddp(world1):
    """A fresh small DDP model, its optimizer and DataLoader; the exporter is closed after."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import exporter

    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    yield model, loader, opt
    obs = exporter.active()
    if obs is not None:
        obs.close()


def train_epoch(model, loader, opt, explicit=False):
    """Run one epoch of plain training."""
    import torch

    import exporter

    for x, y in loader:
        if explicit:
            with exporter.step():
                torch.nn.functional.mse_loss(model(x), y).backward()
        else:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
