"""Train a tiny config-built BERT with transformers.Trainer, then a loop with accelerate.

Run under torchrun (2 ranks, CPU, gloo). Each is run plain and instrumented on the same data;
in the instrumented Trainer run rank 1's dataset is slow (a data straggler). Rank 0 writes one
JSON verdict per rank to the path in argv[1].
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from results import leave, write_all_ranks
from scrape_util import scrape  # a sibling of this script (its dir is sys.path[0])
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import exporter
from exporter.integrations.transformers import ExporterCallback
from exporter.sources.sections import REGISTRY

N, BATCH, ACCUM = 96, 4, 3  # samples, per-device batch, gradient_accumulation_steps
SLOW_RANK, SLOW_S = 1, 0.01  # added to every sample the slow rank loads


class Data(torch.utils.data.Dataset):
    def __init__(self, slow: bool) -> None:
        g = torch.Generator().manual_seed(3)
        self.ids = torch.randint(0, 64, (N, 12), generator=g)
        self.labels = torch.randint(0, 2, (N,), generator=g)
        self.slow = slow and dist.get_rank() == SLOW_RANK

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        if self.slow:
            time.sleep(SLOW_S)
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    return BertForSequenceClassification(cfg)


class Probe(TrainerCallback):
    """Scrape the endpoint (before ExporterCallback closes it) and count optimizer steps; see
    which section runs while the Trainer evaluates."""

    def __init__(self) -> None:
        self.result: dict = {}
        self.taken = 0
        self.busy: set = set()

    def on_prediction_step(self, args, state, control, **kwargs):
        self.busy.add(str(REGISTRY.busy()))

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.taken += 1

    def on_train_end(self, args, state, control, **kwargs):
        obs = exporter.active()
        if obs is not None:
            self.result = scrape(obs.url)
            self.result["pg"] = getattr(obs.model.process_group, "group_name", "0")


def run_trainer(instrumented: bool, root: str) -> tuple:
    model = tiny_bert()
    args = TrainingArguments(
        output_dir=root,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUM,
        num_train_epochs=1,
        learning_rate=1e-3,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        eval_strategy="steps",
        eval_steps=2,  # two evaluations and one checkpoint in the run's 4 optimizer steps
        save_strategy="steps",
        save_steps=4,
        save_only_model=True,
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Data(slow=instrumented),
        eval_dataset=torch.utils.data.Subset(Data(slow=False), range(16)),
    )
    probe = Probe()
    trainer.add_callback(probe)
    if instrumented:
        trainer.add_callback(ExporterCallback(trainer, port=0, addr="127.0.0.1", heartbeat_s=0))
    trainer.train()
    inner = trainer.optimizer.optimizer  # accelerate's AcceleratedOptimizer wraps the real one
    hooks = len(inner._optimizer_step_pre_hooks) + len(inner._optimizer_step_post_hooks)
    probe.result["busy"] = sorted(probe.busy)
    probe.result["restored"] = not {"evaluate", "_save_checkpoint"} & set(vars(trainer))
    return model, trainer.state.global_step, probe, hooks


def run_accelerate(instrumented: bool) -> tuple:
    """The documented recipe: instrument what accelerator.prepare returns."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    ds = Data(slow=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH)
    model, opt, loader = accelerator.prepare(net, opt, loader)
    obs = None
    if instrumented:
        obs = exporter.instrument(
            model, dataloader=loader, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0
        )
    taken = 0
    for batch in loader:
        with accelerator.accumulate(model):
            x = batch["input_ids"].float()
            loss = torch.nn.functional.cross_entropy(model(x), batch["labels"])
            accelerator.backward(loss)
            opt.step()
            taken += int(accelerator.sync_gradients)
            opt.zero_grad()
    result = {"taken": taken}
    if obs is not None:
        result.update(scrape(obs.url))
        result["pg"] = getattr(model.process_group, "group_name", "0")
        obs.close()
    return net, result


def main() -> None:
    root = os.path.dirname(os.path.abspath(sys.argv[1]))  # the test's tmp_path
    plain, plain_steps, _, _ = run_trainer(False, root)
    inst, steps, probe, hooks = run_trainer(True, root)
    rank = dist.get_rank()
    trainer_out = {
        "params_identical": all(
            torch.equal(a, b) for a, b in zip(plain.parameters(), inst.parameters())
        ),
        "global_step": steps,
        "plain_global_step": plain_steps,
        "taken": probe.taken,
        "closed": exporter.active() is None,
        "hooks_left": hooks,
        **probe.result,
    }
    a_plain, a_plain_res = run_accelerate(False)
    a_inst, a_res = run_accelerate(True)
    acc_out = {
        "params_identical": all(
            torch.equal(a, b) for a, b in zip(a_plain.parameters(), a_inst.parameters())
        ),
        "plain_taken": a_plain_res["taken"],
        **a_res,
    }
    out = {"trainer": trainer_out, "accelerate": acc_out}
    print(f"rank {rank}: {out}", flush=True)
    write_all_ranks(sys.argv[1], out)
    leave()


if __name__ == "__main__":
    main()
