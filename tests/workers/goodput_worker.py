"""The goodput drill's job: every kind of lost time, once, each measured on its own clock.

Used by tests/test_goodput_drill.py under ``torchrun --standalone --max-restarts 1`` on gloo,
with ``DDP_EXPORTER_ON_HANG=abort``. Attempt 0: a healthy start, a straggler period (rank 1
computes ``--straggle`` seconds more per step), a declared checkpoint on rank 0 (the only one:
the restart resumes from it), healthy steps, then rank 2 blocks in user code and the hang action
aborts the run. Attempt 1 resumes from the checkpoint (redoing the steps after it) and trains to
``--steps``, then ends cleanly. Every rank tells the exporter the step it resumed at.

What each period took, by the worker's own clock, for the test to compare with the account::

    measure begin UNIX          rank 0, attempt 0, the script's first line
    measure healthy_step S      rank 0, attempt 0: mean wall time of its healthy steps
    measure straggler S         rank 1: the compute it added
    measure checkpoint S        rank 0: the declared checkpoint's length
    measure onset UNIX          rank 2, as it blocks
    measure first_step UNIX     rank 0, attempt 1, as its first step starts
    measure redo_step S         rank 0, attempt 1: mean wall time of the steps it redid
    measure end UNIX            rank 0, last attempt, just before it closes the exporter

argv: WORKDIR --port P [--steps N] [--straggle S] [--straggle-steps A:B] [--no-checkpoint]
[--no-hang]. ``--straggle-steps 20:100000 --no-checkpoint --no-hang`` is the alert drill's job:
rank 1 straggles from step 20 to the end, and nothing else goes wrong.
"""

import time

BEGIN = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from results import leave  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import exporter  # noqa: E402

STEP_S = 0.04
#: Step boundaries of attempt 0: healthy to STRAGGLE, straggling to CHECKPOINT, the declared
#: checkpoint, healthy to HANG, where rank 2 blocks.
STRAGGLE, CHECKPOINT, HANG = 60, 120, 200
#: Seconds the declared checkpoint takes (a slow shared file system).
CHECKPOINT_S = 5.0


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_for_data(seconds: float) -> None:
    """Stand in for a data source that stops answering."""
    time.sleep(seconds)  # stuck here


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("workdir")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--steps", type=int, default=260)
    p.add_argument("--straggle", type=float, default=0.1)
    p.add_argument("--straggle-steps", default=f"{STRAGGLE}:{CHECKPOINT}")
    p.add_argument("--no-checkpoint", action="store_true")
    p.add_argument("--no-hang", action="store_true")
    args = p.parse_args()
    straggle_from, straggle_to = (int(x) for x in args.straggle_steps.split(":"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if rank == 0 and attempt == 0:
        say(f"measure begin {BEGIN}")
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = os.path.join(args.workdir, "checkpoint.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path, map_location="cpu")
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    say(f"rank {rank}: attempt {attempt} resumed at step {step}")
    obs = exporter.instrument(
        model, optimizer=opt, port=args.port, addr="127.0.0.1", start_step=step
    )
    say(f"rank {rank}: metrics at {obs.url}")
    first, added, marks = attempt == 0, 0.0, {}
    while step < args.steps:
        if first and rank == 2 and step == HANG and not args.no_hang:
            say(f"measure onset {time.time()}")
            wait_for_data(3600)
        if first and rank == 0 and step == CHECKPOINT and not args.no_checkpoint:
            t0 = time.time()
            with exporter.deadline("checkpoint", seconds=600):
                torch.save(
                    {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step},
                    path + ".tmp",
                )
                time.sleep(CHECKPOINT_S)
                os.replace(path + ".tmp", path)
            say(f"measure checkpoint {time.time() - t0}")
        if rank == 0 and attempt > 0 and not marks:
            marks["first"] = True
            say(f"measure first_step {time.time()}")
        if first and rank == 1 and straggle_from <= step < straggle_to:
            time.sleep(args.straggle)  # a slower GPU, a busier host: more compute per step
            added += args.straggle
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        if first and rank == 0 and step in (10, STRAGGLE, CHECKPOINT + 10, HANG):
            marks[step] = time.time()
            if step == HANG:  # the next step hangs: say now what the healthy ones took
                spans = marks[STRAGGLE] - marks[10] + marks[HANG] - marks[CHECKPOINT + 10]
                say(f"measure healthy_step {spans / (STRAGGLE - 10 + HANG - CHECKPOINT - 10)}")
        if not first and rank == 0 and step in (CHECKPOINT + 10, HANG):
            marks[step] = time.time()
            if step == HANG:  # the redone steps' pace: the host's now, not attempt 0's
                span = marks[HANG] - marks[CHECKPOINT + 10]
                say(f"measure redo_step {span / (HANG - CHECKPOINT - 10)}")
        if first and rank == 1 and step == min(straggle_to, args.steps):
            say(f"measure straggler {added}")
        time.sleep(STEP_S)
    say(f"rank {rank}: finished at step {step}")
    if rank == 0:
        say(f"measure end {time.time()}")
    leave()


if __name__ == "__main__":
    main()
