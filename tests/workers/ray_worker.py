"""Train under Ray Train (2 CPU workers, gloo) with rank 1 slowed in compute, twice.

Ray Train runs the training function on a thread of each worker, not its main thread: the
exporter, instrumented there, must count that thread's waits. Each worker trains a loop of
collectives (gradients averaged by hand), then a DDP model from ``prepare_model``, each
instrumented and closed in turn, and writes what its endpoint served at the end of each to
``<argv[1]>/rank-<rank>.json``; argv[2] is Ray's session folder (a short path: Ray's sockets
live under it).
"""

import json
import os
import sys
import threading
import time

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

STEPS = 100  # per kind
SLOW_RANK, SLOW_S = 1, 0.03  # added to every step of the slow rank, before its collectives
STEP_S = 0.01
KINDS = ("loop", "ddp")


def _train(kind: str, rank: int) -> dict:
    """Instrument one model on this thread, train it, return what its endpoint served."""
    import torch
    import torch.distributed as dist
    from ray.train.torch import prepare_model
    from scrape_util import scrape

    import exporter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
    if kind == "ddp":
        model = prepare_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1")
    try:
        for _ in range(STEPS):
            x, y = torch.randn(16, 32), torch.randn(16, 3)
            loss = torch.nn.functional.mse_loss(model(x), y)
            time.sleep(STEP_S + (SLOW_S if rank == SLOW_RANK else 0.0))
            opt.zero_grad()
            loss.backward()  # DDP: the healthy rank waits here for the slow one
            if kind == "loop":
                for p in model.parameters():
                    dist.all_reduce(p.grad)  # the loop: it waits here
                    p.grad /= dist.get_world_size()
            opt.step()
        out = scrape(obs.url)
        out["training"] = obs.training_thread == threading.get_ident()
        return out
    finally:
        obs.close()  # Ray ends its workers without the interpreter's exit


def train(config: dict) -> None:
    """Train each kind on the thread Ray runs this on; write what was served."""
    import torch.distributed as dist

    rank = dist.get_rank()
    out: dict = {kind: _train(kind, rank) for kind in KINDS}
    out.update(rank=rank, main=threading.current_thread() is threading.main_thread())
    with open(os.path.join(config["out"], f"rank-{rank}.json"), "w") as f:
        json.dump(out, f)


def main() -> int:
    out, session = sys.argv[1], sys.argv[2]
    # Ray's workers import the scrape helper beside this file.
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",  # the test's cluster on loopback only
        _temp_dir=session,
        runtime_env={"env_vars": {"PYTHONPATH": here + os.pathsep + os.environ["PYTHONPATH"]}},
    )
    try:
        TorchTrainer(
            train,
            train_loop_config={"out": out},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(storage_path=os.path.join(out, "ray"), name="exporter"),
        ).fit()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
