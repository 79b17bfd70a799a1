"""Start one rank late, with the init watch on every rank, then train until told to stop.

Run under torchrun: ``init_worker.py LATE_RANK GO_FILE STOP_FILE``. Every rank prints its pid
(the test kills leftovers by pid: torchrun's workers live in their own sessions). The late rank
waits for GO_FILE before it starts the exporter and joins ``init_process_group``, like a rank
whose node came up late; the test holds it there while it scrapes the others.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from results import leave
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter
from exporter.tools.demo import say


def wait_file(path: str, timeout: float) -> bool:
    """Wait for ``path`` to exist; False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def main() -> None:
    late_rank, go_file, stop_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    rank = int(os.environ["RANK"])
    say(f"rank {rank}: pid {os.getpid()}")
    if rank == late_rank and not wait_file(go_file, 150):
        say(f"rank {rank}: never released")
        sys.exit(3)
    watch = exporter.watch_init(port=0, addr="127.0.0.1")
    say(f"rank {rank}: metrics at http://127.0.0.1:{watch.port}/metrics")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    obs = exporter.instrument(model, optimizer=opt)
    say(f"rank {rank}: instrument took over port {obs.port} (watch port {watch.port})")
    deadline = time.monotonic() + 150
    stop = torch.zeros(1)
    while stop.item() == 0:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
        opt.step()
        # Every rank stops at the same step: the flag is agreed on with an allreduce.
        stop.fill_(float(os.path.exists(stop_file) or time.monotonic() > deadline))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        time.sleep(0.05)
    say(f"rank {rank}: done")
    leave()  # closes the exporter and the group


if __name__ == "__main__":
    main()
