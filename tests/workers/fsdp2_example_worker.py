"""The shape of pytorch/examples' ``distributed/FSDP2/example.py`` on CPU/gloo, instrumented.

A small transformer (dimension 16, 4 heads, vocabulary 1024, sequences of 64, batches of 32,
``--layers`` blocks), ``fully_shard`` on every block and at the root, Adam, and the example's loop:
forward, ``loss.backward()``, ``torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`` (on
FSDP2's DTensor parameters: a functional all-reduce of the total norm) unless ``--no-clip``,
``optim.step()``, ``optim.zero_grad()``, with the one ``exporter.instrument(model,
optimizer=optim)`` line (steps are optimizer steps). Trains until stopped (or ``--steps``).

Used by tests/test_dilution.py and benchmarks/dilution.py, which throttle a rank from outside
(SIGSTOP/SIGCONT). Prints ``rank R: metrics at URL`` and ``pid R PID``.
``--no-functional-timing`` switches the exporter's timing of functional collectives off: the
exporter as it counted before it timed them (the benchmark's "before" arm).

argv: [--layers N] [--no-clip] [--steps N] [--port P] [--no-functional-timing]
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - as the example writes it
from results import leave
from torch import nn
from torch.distributed.fsdp import fully_shard

import exporter

DIM, HEADS, VOCAB, SEQ, BATCH = 16, 4, 1024, 64, 32


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Block(nn.Module):
    """Pre-norm attention and feed-forward, as the example's TransformerBlock."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.ffn_norm = nn.LayerNorm(DIM)
        self.w1, self.w2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (
            w(x).view(b, n, HEADS, DIM // HEADS).transpose(1, 2)
            for w in (self.wq, self.wk, self.wv)
        )
        out = F.scaled_dot_product_attention(q, k, v)
        return self.wo(out.transpose(1, 2).contiguous().view(b, n, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.w2(F.gelu(self.w1(self.ffn_norm(h))))


class Transformer(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.pos_embeddings = nn.Embedding(SEQ, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.size(1)))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--no-clip", dest="clip", action="store_false")
    p.add_argument("--steps", type=int, default=0, help="0: until stopped")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--no-functional-timing", action="store_true")
    args = p.parse_args()
    if args.no_functional_timing:
        from exporter.sources.functional import FunctionalCollectiveTiming

        FunctionalCollectiveTiming.instrument = lambda self: False  # type: ignore[method-assign]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    say(f"pid {rank} {os.getpid()}")
    torch.manual_seed(0)
    model = Transformer(args.layers)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    obs = exporter.instrument(model, optimizer=optim, port=args.port, addr="127.0.0.1")
    say(f"rank {rank}: metrics at {obs.url}")
    step = 0
    while not args.steps or step < args.steps:
        x = torch.randint(0, VOCAB, (BATCH, SEQ))
        loss = model(x).sum()
        loss.backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        optim.zero_grad()
        step += 1
    obs.close()
    leave()


if __name__ == "__main__":
    main()
