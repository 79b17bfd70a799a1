"""Fit a tiny LightningModule with ModelParallelStrategy and ExporterCallback (2 ranks, CPU, gloo).

The module applies FSDP2 (``fully_shard``) in ``configure_model`` over the strategy's data
parallel mesh. (Lightning's ``FSDPStrategy``, classic FSDP, refuses a CPU accelerator, and
torch's classic FSDP needs an accelerator device.) argv: RESULTS. Rank 0 writes what each rank's
endpoint said at the end of training and Lightning's step count.
"""

import os
import sys

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from results import leave, write_all_ranks
from scrape_util import scrape

import exporter
from exporter.integrations.lightning import ExporterCallback

BATCHES = 16


class Tiny(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3)
        )

    def configure_model(self) -> None:
        # ModelParallelStrategy leaves the sharding to the module.
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in (self.net[0], self.net[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(self, mesh=mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Probe(Callback):
    """Scrape the endpoint before ExporterCallback closes it at teardown."""

    def __init__(self) -> None:
        self.result: dict = {}

    def on_train_end(self, trainer, pl_module) -> None:
        obs = exporter.active()
        self.result = scrape(obs.url) if obs is not None else {"missing": True}


def main() -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    n = BATCHES * 8 * 2
    data = torch.utils.data.TensorDataset(
        torch.randn(n, 32, generator=g), torch.randn(n, 3, generator=g)
    )
    probe = Probe()
    trainer = Trainer(
        accelerator="cpu",
        strategy=strategy,
        devices=2,
        max_epochs=1,
        callbacks=[ExporterCallback(port=0, addr="127.0.0.1", heartbeat_s=0), probe],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=os.path.dirname(os.path.abspath(sys.argv[1])),
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
    out = {
        "global_step": trainer.global_step,
        "closed": exporter.active() is None,
        **probe.result,
    }
    write_all_ranks(sys.argv[1], out)
    leave()


if __name__ == "__main__":
    main()
