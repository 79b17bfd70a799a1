"""A copy of the model and a forked child of a rank carry none of the exporter's state."""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys

import pytest
import torch
from harness import REPO, child_env

import exporter


@pytest.mark.unit
def test_a_model_copied_or_saved_before_its_first_forward_carries_no_exporter(ddp):
    """Copying an instrumented model before its first forward (an EMA) raised TypeError."""
    model, loader, opt = ddp
    plain = model.module
    obs = exporter.instrument(model, port=0, addr="127.0.0.1", heartbeat_s=0)
    x = torch.randn(4, 8)
    for original in (model, plain):
        twin = copy.deepcopy(original)
        saved = io.BytesIO()
        torch.save(original, saved)
        assert b"exporter" not in pickle.dumps(original)  # it loads where nothing is installed
        saved.seek(0)
        loaded = torch.load(saved, weights_only=False)
        for other in (twin, loaded):
            assert torch.equal(other(x), plain(x))
    assert obs.recorder.open_since() is None  # a copy's forward is not the model's
    model(x)
    assert obs.recorder.open_since() is not None  # the model's own first forward still is


_FORKED = """
import os, signal, socket, sys, time
import torch, torch.distributed as dist
import exporter
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
model = torch.nn.Linear(2, 2)
obs = exporter.instrument(model, port=0, addr="127.0.0.1", heartbeat_s=0.2)
port, mode = obs.port, sys.argv[1]
pid = os.fork()
if pid == 0:
    if mode == "exit":
        sys.exit(0)  # the exit handlers run here, in the child
    time.sleep(120)  # a helper that outlives the rank
    os._exit(0)
try:
    if mode == "exit":
        deadline = time.monotonic() + 60
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            assert time.monotonic() < deadline, "the forked child did not exit"
            time.sleep(0.05)
        obs.heartbeat.poll()
        print("ended by the child:", sorted(obs.heartbeat.finished_peers()))
    obs.close()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        print("port free after the rank closed")
finally:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass  # it exited, and was waited for
"""


@pytest.mark.tool
@pytest.mark.parametrize("mode", ["exit", "linger"])
def test_a_forked_child_neither_ends_the_rank_nor_keeps_its_port(mode):
    """A child that exited hung in closing the rank's server and published the rank's end;
    a child that lived on kept the rank's port bound after the rank ended."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORKED, mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=child_env(),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "port free after the rank closed" in out
    if mode == "exit":
        assert "ended by the child: []" in out
