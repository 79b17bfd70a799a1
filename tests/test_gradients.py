"""Gradients with the exporter are bit-identical to gradients without it (2 ranks, gloo)."""

import json

from harness import Job


def test_gradients_bit_identical(tmp_path):
    out = tmp_path / "verdict.json"
    with Job(2, [str(out)], module="tests/workers/grad_worker.py") as job:
        assert job.wait(timeout=240) == 0, job.output()
    results = json.loads(out.read_text())
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            assert r["grads"], f"rank {rank} {name}: gradients differ"
            assert r["params"], f"rank {rank} {name}: parameters differ"
            assert r["steps"] == 6, (rank, name, r)
        # The wrapper timed every bucket where it could wrap the hook ...
        assert per_rank["builtin"]["buckets"] > 6
        assert per_rank["fp16_after"]["buckets"] > 6
        # ... and a hook registered before instrument() is left alone (no timing, same math).
        assert per_rank["fp16_before"]["buckets"] == 0
