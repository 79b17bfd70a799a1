"""Train a loop of collectives under Ray Train (2 CPU workers, gloo), rank 1 slowed in compute.

Ray Train runs the training function on a thread of each worker, not its main thread: the
exporter, instrumented there, must count that thread's waits. Each rank writes what its
endpoint served at the end to ``<argv[1]>/rank-<rank>.json``; argv[2] is Ray's session folder
(a short path: Ray's sockets live under it).
"""

import json
import os
import sys
import threading
import time

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

STEPS = 120
SLOW_RANK, SLOW_S = 1, 0.03  # added to every step of the slow rank, before its collectives
STEP_S = 0.01


def train(config: dict) -> None:
    """Instrument on the thread Ray runs this on, train by hand-averaged gradients, report."""
    import torch
    import torch.distributed as dist
    from scrape_util import scrape

    import exporter

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1")
    for _ in range(STEPS):
        x, y = torch.randn(16, 32), torch.randn(16, 3)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        time.sleep(STEP_S + (SLOW_S if rank == SLOW_RANK else 0.0))
        for p in model.parameters():
            dist.all_reduce(p.grad)  # the healthy rank waits here for the slow one
            p.grad /= world
        opt.step()
    out = scrape(obs.url)
    out.update(
        rank=rank,
        thread=threading.current_thread().name,
        main=threading.current_thread() is threading.main_thread(),
        training=obs.training_thread == threading.get_ident(),
    )
    obs.close()
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
