"""Zero-code instrumentation in one process: the hooks, the import watch, the sitecustomize chain.

The hooks of :class:`~exporter.autorun.instrumentor.AutoInstrumentor` on a real one-rank gloo
group: the model, optimizer and DataLoader a script made are found at its first step, every step
is counted, a script that instruments itself keeps its own handle, and uninstrument() puts
DataLoader back. Jobs under ``ddp-exporter run``: tests/test_run_command.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from harness import child_env

import exporter
from exporter.autorun import BOOT_DIR, postimport
from exporter.autorun.instrumentor import AutoInstrumentor

pytestmark = pytest.mark.unit


def _script(world1, steps: int, *, wrap: bool = True, instrument: bool = False):
    """Build what a script builds after the hooks are armed, train ``steps`` steps; return it."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = DDP(inner) if wrap else inner
    other = torch.nn.Sequential(torch.nn.Linear(8, 8))  # a module the optimizer does not train
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if instrument:
        exporter.instrument(model, dataloader=loader, optimizer=opt, port=0, addr="127.0.0.1")
    done = 0
    while done < steps:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            done += 1
            if done == steps:
                break
    return model, other, loader, opt


@pytest.fixture
def hooks(world1, monkeypatch):
    monkeypatch.setenv("DDP_EXPORTER_PORT", "0")
    monkeypatch.setenv("DDP_EXPORTER_ADDR", "127.0.0.1")
    auto = AutoInstrumentor().instrument()
    yield auto
    auto.uninstrument()
    obs = exporter.active()
    if obs is not None:
        obs.close()


def test_the_first_step_instruments_the_outer_model_its_optimizer_and_loader(hooks, world1):
    original_iter, original_destroy = hooks._orig_iter, hooks._orig_destroy
    model, _, loader, opt = _script(world1, 13)
    obs = exporter.active()
    assert obs is not None and obs is hooks.observer
    assert obs.model is model and obs.parallelism == "ddp"
    snap = obs.recorder.snapshot()
    assert obs.recorder.steps == 13  # the first step too: the script's own count
    assert snap.phase_sum[0] > 0.0  # the epoch already running has its batches timed
    hooks.uninstrument()
    assert torch.utils.data.DataLoader.__iter__ is original_iter
    assert torch.distributed.destroy_process_group is original_destroy
    hooks.uninstrument()  # twice: nothing


def test_without_a_wrapper_the_plain_model_is_watched_by_its_collectives(hooks, world1):
    model, other, _, _ = _script(world1, 4, wrap=False)
    obs = exporter.active()
    assert obs is not None and obs.model is model and obs.model is not other
    assert obs.parallelism == "module"


def test_a_script_that_instruments_itself_keeps_its_one_handle(hooks, world1):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _script(world1, 5, instrument=True)
    assert not [w for w in caught if "called twice" in str(w.message)]
    obs = exporter.active()
    assert obs is not None and hooks.observer is None and hooks.triggered
    assert obs.recorder.steps == 5


def test_a_loader_iterated_before_the_first_step_is_the_one_timed(hooks, world1):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(4, 1))
    evaluation = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4)
    train = torch.utils.data.DataLoader(torch.randn(32, 4), batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in evaluation:
        model(x)
    for x in train:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    obs = hooks.observer
    assert obs is not None
    data_before = obs.recorder.snapshot().phase_sum[0]
    for x in evaluation:  # after the first step: not the training loader, not timed
        model(x)
    assert obs.recorder.snapshot().phase_sum[0] == data_before
    assert type(iter(evaluation)).__name__ == "LazyTimedIterator"


def test_post_import_callback_runs_once_after_the_module_code(tmp_path, monkeypatch):
    (tmp_path / "ddp_autorun_probe.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    postimport.when_imported("ddp_autorun_probe", lambda m: seen.append(m.VALUE))
    assert seen == []
    # A look-up that imports nothing (libraries check what is installed) does not use it up.
    assert importlib.util.find_spec("ddp_autorun_probe") is not None
    assert seen == [] and "ddp_autorun_probe" not in sys.modules
    import ddp_autorun_probe  # noqa: F401

    assert seen == [41]
    # The module keeps its own loader (importlib.resources and reloads read it).
    assert type(ddp_autorun_probe.__loader__).__name__ == "SourceFileLoader"
    postimport.when_imported("ddp_autorun_probe", lambda m: seen.append(m.VALUE + 1))
    assert seen == [41, 42]  # already imported: at once
    sys.modules.pop("ddp_autorun_probe")


@pytest.mark.parametrize("armed", ["1", "0"])
def test_the_sitecustomize_arms_only_when_asked_and_runs_the_one_it_hides(tmp_path, armed):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    # Theirs runs, and what it adds to sys.path stays there.
    added = tmp_path / "added"
    (theirs / "sitecustomize.py").write_text(
        f"import os, sys\nos.environ['THEIRS_RAN'] = '1'\nsys.path.append({str(added)!r})\n"
    )
    probe = textwrap.dedent(
        """
        import importlib.util, os, sys
        print("torch" in sys.modules, os.environ.get("THEIRS_RAN"))
        import exporter.autorun as a
        print(len(a._armed))
        importlib.util.find_spec("torch")  # as transformers checks, before importing it
        import torch
        print(len(a._armed), sys.path[-1] == os.environ["THEIRS_ADDED"])
        """
    )
    env = child_env({"DDP_EXPORTER_AUTORUN": armed, "THEIRS_ADDED": str(added)})
    env["PYTHONPATH"] = f"{BOOT_DIR}:{env['PYTHONPATH']}:{theirs}"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    # Armed or not, torch is not imported for the process, and their sitecustomize still runs;
    # armed, the hooks are in place once the process imports torch.
    hooks = ["1", "2"] if armed == "1" else ["0", "0"]
    assert out.stdout.split() == ["False", "1", hooks[0], hooks[1], "True"], out.stderr
