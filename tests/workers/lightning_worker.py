"""Fit a tiny LightningModule plain, then with ExporterCallback and rank 1 slowed in compute.

Run under torchrun (2 ranks, gloo, Lightning's DDP strategy on CPU). Rank 0 writes one JSON
verdict per rank to the path in argv[1]: what the instrumented rank's endpoint said at the end
of training, Lightning's own step count, and whether the parameters match the plain fit.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from results import leave, write_all_ranks
from scrape_util import scrape
from torch.distributed.algorithms.ddp_comm_hooks import (
    default_hooks,  # a sibling of this script (its dir is sys.path[0])
)

import exporter
from exporter.integrations.lightning import ExporterCallback
from exporter.sources.sections import REGISTRY

BATCHES = 24  # per rank and epoch
ACCUM = 2  # accumulate_grad_batches
SLOW_RANK, SLOW_S = 1, 0.03  # added to every training_step of the slow rank


class Tiny(LightningModule):
    def __init__(self, slow: bool) -> None:
        super().__init__()
        self.slow = slow
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3)
        )

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch, batch_idx):
        if self.slow and self.global_rank == SLOW_RANK:
            time.sleep(SLOW_S)  # a straggler in compute: inside Lightning's optimizer closure
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class FP16Hook(Callback):
    """Register a comm hook the way README says, after ExporterCallback has instrumented."""

    def on_train_start(self, trainer, pl_module) -> None:
        trainer.strategy.model.register_comm_hook(None, default_hooks.fp16_compress_hook)


class Probe(Callback):
    """Scrape the endpoint before ExporterCallback closes it at teardown; see which section
    runs while Lightning validates and saves a checkpoint."""

    def __init__(self) -> None:
        self.result: dict = {}
        self.busy: dict[str, set] = {"validation": set(), "checkpoint": set()}

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.busy["validation"].add(REGISTRY.busy())

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.busy["checkpoint"].add(REGISTRY.busy())

    def on_train_end(self, trainer, pl_module) -> None:
        obs = exporter.active()
        self.result = scrape(obs.url) if obs is not None else {"missing": True}


def fit(instrumented: bool, root: str):
    torch.manual_seed(0)
    model = Tiny(slow=instrumented)
    g = torch.Generator().manual_seed(7)
    n = BATCHES * 8 * 2
    data = torch.utils.data.TensorDataset(
        torch.randn(n, 32, generator=g), torch.randn(n, 3, generator=g)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    val = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(32)), batch_size=8)
    probe = Probe()
    callbacks = (
        [ExporterCallback(port=0, addr="127.0.0.1", heartbeat_s=0), probe] if instrumented else []
    )
    trainer = Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_epochs=1,
        accumulate_grad_batches=ACCUM,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=True,  # ModelCheckpoint saves at the end of the epoch
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    taken = [0]
    trainer_opt_hook = []
    pg: list[str] = []

    class Count(Callback):
        def on_train_start(self, trainer, pl_module):
            opt = trainer.optimizers[0]
            trainer_opt_hook.append(opt)
            pg.append(getattr(trainer.strategy.model.process_group, "group_name", "0"))
            opt.register_step_post_hook(lambda *a: taken.__setitem__(0, taken[0] + 1))

    trainer.callbacks.append(Count())
    trainer.fit(model, loader, val)
    opt = trainer_opt_hook[0]
    busy = {k: sorted(map(str, v)) for k, v in probe.busy.items()}
    return model, trainer, {**probe.result, "pg": pg[0], "busy": busy}, taken[0], opt


def main() -> None:
    root = os.path.dirname(os.path.abspath(sys.argv[1]))  # the test's tmp_path
    plain, _, _, plain_taken, _ = fit(False, root)
    inst, trainer, result, taken, opt = fit(True, root)
    rank = dist.get_rank()
    same = all(torch.equal(a, b) for a, b in zip(plain.parameters(), inst.parameters()))
    out = {
        "params_identical": same,
        "global_step": trainer.global_step,
        "taken": taken,
        "plain_taken": plain_taken,
        "closed": exporter.active() is None,
        # Lightning's save_checkpoint runs through the trainer attribute only while exported.
        "save_restored": "save_checkpoint" not in vars(trainer),
        # Count's own post hook is the only one left once the exporter restored the optimizer.
        "hooks_left": len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks),
        **result,
    }
    print(f"rank {rank}: {out}", flush=True)
    write_all_ranks(sys.argv[1], out)
    leave()


if __name__ == "__main__":
    main()
