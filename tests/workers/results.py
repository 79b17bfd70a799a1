"""Hand a worker's per-rank results to the test, and end the worker once they are out."""

import json
import os
import sys
import time
from typing import NoReturn

import torch
import torch.distributed as dist

import exporter


def write_all_ranks(path: str, out: object) -> None:
    """Gather every rank's ``out`` (a collective: call it on every rank) and write the list."""
    results = [None] * dist.get_world_size()
    dist.all_gather_object(results, out)
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump(results, f)


def leave(code: int = 0) -> NoReturn:
    """End a worker whose results are written and printed: close, destroy the group, _exit.

    torch 2.13 + gloo aborts at interpreter exit after ``destroy_process_group()`` in about one
    run of six here ("terminate called without an active exception", SIGABRT), without the
    exporter too: gloo's threads still hold work whose tensors are freed during interpreter
    finalization (upstream teardown race, see pytorch/pytorch PR 179291). The worker's results
    are out by now, so it leaves with ``os._exit`` and skips that finalization; a crash while
    the worker and the exporter still work happens before this point and fails the test.
    """
    obs = exporter.active()
    if obs is not None:
        obs.close()  # what the exporter's atexit handler would do; os._exit skips atexit
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def settled(obs: exporter.Observer, timeout: float = 30.0) -> bool:
    """Wait until every collective the exporter saw launch is marked complete; say if it was.

    On CUDA the exporter resolves its CUDA events (the events mode's marks, the hook's pairs) on
    its own thread once the GPU passed them: the GPU is synchronised first.
    """
    if obs.device.type == "cuda":
        torch.cuda.synchronize()
    deadline = time.monotonic() + timeout
    marks = obs.comm_instrumentor.parts[0]  # the events mode: marks waiting to be resolved
    while getattr(marks, "pending", 0) or not all(
        enq == done for _, enq, done, _ in obs.recorder.inflight()
    ):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
