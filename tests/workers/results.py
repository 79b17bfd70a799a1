"""Hand a worker's per-rank results to the test: gathered on rank 0, written as JSON."""

import json

import torch.distributed as dist


def write_all_ranks(path: str, out: object) -> None:
    """Gather every rank's ``out`` (a collective: call it on every rank) and write the list."""
    results = [None] * dist.get_world_size()
    dist.all_gather_object(results, out)
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump(results, f)
