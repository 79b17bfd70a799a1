"""Gradients with the exporter are bit-identical to gradients without it (2 ranks, gloo).

Every DDP timing mode: the default (DDP's reducer times its own allreduce), the iteration marks
and the timing hook; FSDP2 (``fully_shard``) and classic FSDP, whose torch.distributed
collectives the exporter wraps, and tensor parallelism, whose functional collectives (DTensor's)
it times through stand-ins, each clipping the gradients' total norm (classic FSDP with its own
``clip_grad_norm_``): loss, gradient shards and parameter shards. Every instrumented arm also
reads a web configuration file it cannot serve.
"""

import json

import pytest
from harness import Job

pytestmark = pytest.mark.job


def test_gradients_bit_identical(tmp_path):
    out = tmp_path / "verdict.json"
    # Every arm instrumented with a web configuration file that cannot be served (a field this
    # exporter refuses): logged, nothing served, and the training the same to the bit.
    web = tmp_path / "web.yml"
    web.write_text("rate_limit:\n  burst: 3\n")
    env = {"DDP_EXPORTER_WEB_CONFIG": str(web)}
    with Job(2, [str(out)], module="tests/workers/grad_worker.py", env=env) as job:
        assert job.wait(timeout=240) == 0, job.output()
    assert "rate_limit: not supported; nothing is served" in job.output(), job.output()
    results = json.loads(out.read_text())
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            assert r.get("losses", True), f"rank {rank} {name}: losses differ"
            assert r["grads"], f"rank {rank} {name}: gradients differ"
            assert r["params"], f"rank {rank} {name}: parameters differ"
            assert r["steps"] == 6 and r["settled"], (rank, name, r)
            assert r.get("comm_timing_errors", 0) == 0, (rank, name, r)
        # The wrapper timed every bucket where it could wrap the hook ...
        assert per_rank["builtin/hook"]["buckets"] > 6
        assert per_rank["fp16_after/hook"]["buckets"] > 6
        # ... and a hook registered before instrument() is left alone (no timing, same math).
        assert per_rank["fp16_before/hook"]["buckets"] == 0
        assert per_rank["fp16_before/hook"]["timing"] == "none"
        # The default mode (and the events mode) leave DDP's allreduce in place and time every
        # iteration, whatever hook the user registers, before or after.
        for name in ("builtin", "fp16_after", "fp16_before"):
            for timing, mode in (("auto", "reducer"), ("events", "events")):
                r = per_rank[f"{name}/{timing}"]
                assert r["timing"] == mode and r["buckets"] == 6, (rank, name, r)
        # FSDP2: every all-gather and gradient reduction timed, by kind, and the clipping's
        # all-reduce.
        r = per_rank["fsdp2/collectives"]
        assert r["timing"] == "collectives" and r["buckets"] > 6 * 3, (rank, r)
        assert {"allgather", "reduce_scatter", "allreduce"} <= set(r["ops"]), (rank, r)
        # Classic FSDP: its all-gathers and reduce-scatters, and its clipping's all-reduce.
        r = per_rank["fsdp/collectives"]
        assert r["timing"] == "collectives" and r["buckets"] > 6 * 3, (rank, r)
        assert {"allgather", "reduce_scatter", "allreduce"} <= set(r["ops"]), (rank, r)
        # Tensor parallel: DTensor's all-reduces and all-gathers, functional collectives.
        r = per_rank["tp/collectives"]
        assert r["timing"] == "collectives" and r["buckets"] >= 6 * 4, (rank, r)
        assert {"allgather", "allreduce"} <= set(r["ops"]), (rank, r)
