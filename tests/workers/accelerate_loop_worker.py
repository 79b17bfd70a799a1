"""A plain Accelerate training loop with the one ``instrument()`` line, for a healthy drill.

The shape users write from Accelerate's own examples: ``accelerator.prepare`` a model, an
optimizer and a DataLoader, then loop; the exporter is added on what ``prepare`` returned. It
trains for ``--seconds`` (real compute on one thread per rank, then a wait as long as a GPU
step would keep the host waiting), announces its metrics URL the way
the demo trainer does, and ends cleanly. The run label and file_sd folder come from the
environment (``DDP_EXPORTER_RUN``, ``DDP_EXPORTER_FILE_SD``), as a user's job would set them.

    python tests/workers/accelerate_loop_worker.py --seconds 120   # one process per rank
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator

import exporter
from exporter.tools.demo import say

WIDTH, DEPTH, BATCH = 256, 4, 64
#: Seconds a step waits as if for its accelerator (a GPU step blocks the host about this long).
DEVICE_S = 0.02


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=120.0, help="how long to train")
    p.add_argument("--heartbeat", type=float, default=1.0, help="the exporter's heartbeat, s")
    args = p.parse_args()
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    data = torch.utils.data.TensorDataset(
        torch.randn(BATCH * 16, WIDTH), torch.randn(BATCH * 16, 1)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)
    model, opt, loader = accelerator.prepare(net, opt, loader)
    obs = exporter.instrument(
        model,
        dataloader=loader,
        optimizer=opt,
        port=0,
        addr="127.0.0.1",
        heartbeat_s=args.heartbeat,
    )
    say(f"rank {accelerator.process_index}: metrics at {obs.url}")
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            time.sleep(DEVICE_S)
    obs.close()
    accelerator.end_training()


if __name__ == "__main__":
    main()
