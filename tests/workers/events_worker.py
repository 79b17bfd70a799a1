"""Two or more DDP ranks on gloo timed by iteration marks: where the marks fall, what a straggler shows.

Run with one process per rank or under torchrun; rank 0 writes every rank's report to argv[1].

- ``order``: the marks of a bare :class:`IterationEvents` on a DDP model whose ranks see
  different batches. At each mark it keeps the first parameter's gradient (the last one the
  backward computes): at the compute-end mark it must be this rank's own gradient, complete
  (DDP has not finalised), at the communication-end mark the average over the ranks (DDP has).
  The test compares the mean of every rank's compute-end gradients with the averaged one.
- ``straggler``: the whole exporter (``comm_timing="events"``) while rank 1 sleeps
  ``STRAGGLE_S`` between forward and backward in every step: the recorder's snapshot, once every
  marked iteration is resolved.
"""

import sys
import time

import torch
import torch.distributed as dist
from results import leave, settled, write_all_ranks
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter
from exporter.errors import ErrorCounter
from exporter.sources.ddpevents import HostMarks, IterationEvents
from exporter.sources.recorder import Recorder

STEPS = 6
# Well past what a busy host adds to rank 0's own steps (the monitoring rank starts more).
STRAGGLE_S = 0.4


class Keeping(HostMarks):
    """Host marks that also keep a gradient at each mark."""

    def __init__(self, param: torch.nn.Parameter) -> None:
        self.param = param
        self.kept: list[list[torch.Tensor]] = []

    def begin(self, marks):
        self.kept.append([])
        return super().begin(marks)

    def mark(self, marks, i):
        self.kept[-1].append(self.param.grad.detach().clone())
        super().mark(marks, i)


def make_model() -> DDP:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 4),
    )
    return DDP(net, bucket_cap_mb=0.01)  # several buckets per backward


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def order(rank: int) -> dict:
    model = make_model()
    first = next(model.parameters())
    marks = Keeping(first)
    recorder, errors = Recorder("optimizer"), ErrorCounter()
    stats = recorder.collective_stats("allreduce", "0", None)
    timing = IterationEvents(model, recorder, errors, stats, marks)
    timing.instrument()
    finals = []
    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        x, y = batch(rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        finals.append(first.grad.detach().clone())
    with model.no_sync():  # nothing to reduce: not marked
        x, y = batch(rank, STEPS)
        torch.nn.functional.mse_loss(model(x), y).backward()
    timing.close()
    own = torch.stack([kept[0] for kept in marks.kept]) if marks.kept else torch.empty(0)
    mean = [torch.zeros_like(own) for _ in range(dist.get_world_size())]
    dist.all_gather(mean, own)
    averaged = torch.stack(mean).mean(dim=0)
    return {
        "marked": len(marks.kept),
        "marks_per_iteration": sorted({len(k) for k in marks.kept}),
        "end_is_final": all(torch.equal(k[1], f) for k, f in zip(marks.kept, finals)),
        "compute_end_is_own": all(not torch.equal(k[0], f) for k, f in zip(marks.kept, finals)),
        "own_averages_to_final": all(
            torch.allclose(a, f, rtol=1e-5, atol=1e-7) for a, f in zip(averaged, finals)
        ),
        "resolved": stats.hist.count,
        "errors": {k: n for k, n in errors.snapshot().items() if n},
    }


def straggler(rank: int) -> dict:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    obs = exporter.instrument(
        model, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0, comm_timing="events"
    )
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if rank == 1:
            time.sleep(STRAGGLE_S)  # compute the others wait for inside the allreduce
        loss.backward()
        opt.step()
    settled(obs)
    timing = obs.comm_instrumentor.parts[0]
    snap = obs.recorder.snapshot()
    (op, pg, _, latency_sum, count, nbytes) = snap.collectives[0]
    report = {
        "timing": obs.comm_timing,
        "pending": timing.pending,
        "steps": snap.steps,
        "phase_sum": snap.phase_sum,
        "step_sum": snap.step_sum,
        "count": count,
        "latency_sum": latency_sum,
        "nbytes": nbytes,
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "errors": {k: n for k, n in obs.errors.snapshot().items() if n},
    }
    obs.close()
    return report


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = {"order": order(rank), "straggler": straggler(rank)}
    write_all_ranks(sys.argv[1], out)
    leave()


if __name__ == "__main__":
    main()
