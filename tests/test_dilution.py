"""A mild straggler in an FSDP2 loop that clips gradients is named by compute.

The job has the shape of pytorch/examples' FSDP2 example (tests/workers/fsdp2_example_worker.py:
3 ranks under torchrun, ``clip_grad_norm_`` every step, the one ``instrument(model,
optimizer=optim)`` line). Rank 2 is throttled from outside by a SIGSTOP/SIGCONT duty cycle that
makes its compute about 1.8 times the others' without clipping. ``clip_grad_norm_`` on FSDP2's
DTensor parameters ends in a functional all-reduce, where the healthy ranks wait for rank 2:
counted as their compute, that wait pulled the ratio under the straggler threshold (1.5) and
nobody was named. ``top`` must name rank 2, by compute, and nobody else. The figures behind it:
``benchmarks/dilution.py``.
"""

from __future__ import annotations

import os
import re
import sys

import pytest
from harness import REPO, Job, parse, scrape_text, wait_for

import exporter.tools.top as top

# The benchmark's duty cycle, the same stops and continues as the figures behind this test.
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from dilution import Throttle  # noqa: E402

# Its assertion is about compute per step: another job's CPU load would be a straggler's.
pytestmark = [pytest.mark.job, pytest.mark.solo]

WORKER = os.path.join("tests", "workers", "fsdp2_example_worker.py")
SLOW = 2
#: The mild duty cycle: running, then stopped (seconds).
RUN_S, STOP_S = 0.05, 0.05


def test_a_mild_straggler_is_named_with_clip_grad_norm():
    env = {"OMP_NUM_THREADS": "1", "DDP_EXPORTER_RUN": "dilution"}
    with Job(3, ["--layers", "2"], env=env, module=WORKER) as job:
        urls = job.wait_urls()
        pids = wait_for(
            lambda: dict(re.findall(r"^pid (\d+) (\d+)$", job.text(), re.M)), 60, "the ranks' pids"
        )
        throttle = Throttle(int(pids[str(SLOW)]), RUN_S, STOP_S)
        throttle.start()
        tables: list[dict[int, str]] = []
        # What top computed per read: each rank's suspicion and compute per step (ms).
        figures: list[dict[int, tuple[str, int]]] = []
        history = top.ReadHistory()
        try:

            def named() -> bool:
                rows = history.judge(top.fetch([urls[r] for r in range(3)], timeout=5))
                tables.append({r.rank: r.verdict for r in rows})
                compute = {
                    r.rank: (r.suspect, round(1e3 * r.phases.get("compute", 0))) for r in rows
                }
                figures.append(compute)
                return tables[-1].get(SLOW, "").startswith("straggler: compute")

            what = f"top to name rank {SLOW} a straggler by compute"
            try:
                wait_for(named, 150, what, interval=3.0)
            except AssertionError as exc:
                last = list(zip(tables[-8:], figures[-8:], strict=True))
                raise AssertionError(f"{exc}; its last reads: {last}") from None
        finally:
            throttle.stop()
        wrongly = [
            (r, v)
            for t in tables
            for r, v in t.items()
            if r != SLOW and v.startswith(top.ACCUSATIONS)
        ]
        assert not wrongly, (wrongly, tables)
        # The clipping's all-reduce is seen, timed, on the default group.
        s = parse(scrape_text(urls[0]))
        timed = {(lab["op"], lab["pg"]): v for lab, v in s["ddp_collective_duration_seconds_count"]}
        assert timed.get(("allreduce", "0"), 0) > 0, timed
