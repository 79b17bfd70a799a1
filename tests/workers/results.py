"""Hand a worker's per-rank results to the test, and end the worker once they are out."""

import json
import os
import sys
from typing import NoReturn

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
