"""Train each DDP option plain and instrumented side by side; report what the metrics said.

Run under torchrun (2 ranks, gloo). For every option in ``OPTIONS`` this builds the same model
twice, trains one copy without the exporter and one with it on the same batches, scrapes the
instrumented rank's real HTTP endpoint, and writes one JSON verdict per option and rank to the
path in argv[1] (rank 0 writes). Options whose machinery is missing here report ``skipped``.
"""

import contextlib
import os
import sys

import torch
import torch.distributed as dist
from results import leave, write_all_ranks
from scrape_util import scrape  # a sibling of this script (its dir is sys.path[0])
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import exporter

STEPS = 6  # optimizer steps per option
ACCUM = 3  # micro-batches per optimizer step with no_sync()
INF_STEP = 2  # with the GradScaler, the loss of this iteration is inf on rank 0
# TorchInductor compiles C++ (about 100 s cold for two ranks on two cores); aot_eager runs the
# same Dynamo graph capture, DDPOptimizer bucket split and AOTAutograd backward that meet DDP.
COMPILE_BACKEND = os.environ.get("OPTIONS_COMPILE_BACKEND", "aot_eager")
OPTIONS = (
    "no_sync",
    "amp_bf16_gradscaler",
    "find_unused_parameters",
    "static_graph",
    "gradient_as_bucket_view",
    "new_group",
    "fp16_compress_hook",
    "powersgd_hook",
    "torch_compile",
)


class Net(torch.nn.Module):
    """Two layers and a side branch that odd iterations leave out (for find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.b = torch.nn.Linear(64, 3)
        self.side = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, use_side: bool = True) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        if use_side:
            h = h + torch.tanh(self.side(h))
        return self.b(h)


def compile_unavailable() -> str | None:
    """Return why torch.compile cannot run here, or None when it can."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return f"Dynamo does not support Python {sys.version.split()[0]}"
    if COMPILE_BACKEND == "inductor":
        from shutil import which

        if not any(which(c) for c in ("g++", "c++", "clang++")):
            return "no C++ compiler for TorchInductor's CPU backend"
    return None


def make(option: str, group) -> DDP:
    torch.manual_seed(1234)
    # Several buckets per backward, except for PowerSGD: on gloo its chained allreduces of
    # concurrent buckets can pair up differently on each rank (a collective mismatch that
    # aborts plain DDP just the same), so it gets DDP's default single bucket here; and for
    # torch.compile, whose DDPOptimizer asserts that no bucket is smaller than the first.
    single = option in ("powersgd_hook", "torch_compile")
    kwargs: dict = {} if single else {"bucket_cap_mb": 0.005}
    if option == "find_unused_parameters":
        kwargs["find_unused_parameters"] = True
    if option == "static_graph":
        kwargs["static_graph"] = True
    if option == "gradient_as_bucket_view":
        kwargs["gradient_as_bucket_view"] = True
    if option == "new_group":
        kwargs["process_group"] = group
    return DDP(Net(), **kwargs)


def register_hook(option: str, model: DDP) -> None:
    if option == "fp16_compress_hook":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif option == "powersgd_hook":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def loader(rank: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(100 + rank)
    n = STEPS * ACCUM * 8
    data = torch.utils.data.TensorDataset(
        torch.randn(n, 32, generator=g), torch.randn(n, 3, generator=g)
    )
    return torch.utils.data.DataLoader(data, batch_size=8)


def train(option: str, model: DDP, rank: int) -> tuple[torch.nn.Module, int]:
    """Run the option's loop; return the trained module and the optimizer steps taken."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    taken = [0]
    opt.register_step_post_hook(lambda *a: taken.__setitem__(0, taken[0] + 1))
    dl = loader(rank)
    obs = None
    if getattr(model, "_instrument", False):
        obs = exporter.instrument(
            model, dataloader=dl, optimizer=opt, port=0, addr="127.0.0.1", heartbeat_s=0
        )
        register_hook(option, model)  # a user hook registered after instrument()
    else:
        register_hook(option, model)
    fwd = torch.compile(model, backend=COMPILE_BACKEND) if option == "torch_compile" else model
    scaler = torch.amp.GradScaler("cpu") if option == "amp_bf16_gradscaler" else None
    it = iter(dl)
    micro = ACCUM if option == "no_sync" else 1
    for i in range(STEPS):
        opt.zero_grad()
        for m in range(micro):
            x, y = next(it)
            ctx = model.no_sync() if m < micro - 1 else contextlib.nullcontext()
            with ctx:
                if scaler is not None:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        loss = torch.nn.functional.mse_loss(fwd(x), y)
                    if i == INF_STEP and rank == 0:
                        loss = loss * float("inf")  # the allreduce spreads it to every rank
                    scaler.scale(loss).backward()
                else:
                    kw = {"use_side": i % 2 == 0} if option == "find_unused_parameters" else {}
                    loss = torch.nn.functional.mse_loss(fwd(x, **kw), y)
                    loss.backward()
        if scaler is not None:
            scaler.step(opt)  # skips opt.step() when the gradients hold inf/NaN
            scaler.update()
        else:
            opt.step()
    result = {"taken": taken[0]}
    if obs is not None:
        result.update(scrape(obs.url))
        obs.close()
    return model.module, result


def scenario(option: str, rank: int, group) -> dict:
    if option == "torch_compile":
        why = compile_unavailable()
        if why:
            return {"skipped": why}
        torch._dynamo.reset()
    plain = make(option, group)
    inst = make(option, group)
    inst._instrument = True
    p_mod, p_res = train(option, plain, rank)
    i_mod, i_res = train(option, inst, rank)
    same = all(torch.equal(a, b) for a, b in zip(p_mod.parameters(), i_mod.parameters()))
    return {
        "params_identical": same,
        "plain_taken": p_res["taken"],
        "pg": getattr(inst.process_group, "group_name", "0"),
        **i_res,
    }


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # A subgroup of its own (a second communicator), as jobs that split pipelines/replicas use.
    group = dist.new_group(ranks=list(range(dist.get_world_size())))
    only = os.environ.get("OPTIONS_ONLY")
    out = {}
    for option in OPTIONS:
        if only and option not in only.split(","):
            continue
        out[option] = scenario(option, rank, group)
        print(f"rank {rank} {option}: {out[option]}", flush=True)
    write_all_ranks(sys.argv[1], out)
    leave()


if __name__ == "__main__":
    main()
