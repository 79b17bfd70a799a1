"""The documented join of dcgm-exporter's series with the ranks, on a real Prometheus engine.

dcgm-exporter's output (tests/recordings: its format, labels as its documentation prints them,
the UUID of the H200 the GPU tests ran on) becomes promtool's input series beside two ranks'
``ddp_rank_gpu_info``; the join the GPU guide documents must put run, rank and node on every
DCGM series, through the recording rule the mixin generates.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from promstack import require

from exporter.mixin import rules
from exporter.mixin.config import FAST

pytestmark = pytest.mark.tool

ROOT = Path(__file__).resolve().parent.parent
RECORDING = Path(__file__).parent / "recordings" / "dcgm-exporter.txt"
#: The join, as docs/guides/gpu.md writes it.
JOIN = "DCGM_FI_DEV_SM_CLOCK * on (UUID) group_left (run, rank, node) uuid:ddp_rank_gpu_info:rank"
#: GPU UUID -> (run, rank, node) of the job using it.
RANKS = {
    "GPU-958a0db7-0f4d-47b7-4660-79326b4e9043": ("r1", "0", "gpu-node-1"),
    "GPU-3c6f1a52-88d0-4e1b-9a7d-0b5e2f4c6a19": ("r1", "1", "gpu-node-1"),
}


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def test_the_guide_writes_the_join_tested_here() -> None:
    assert JOIN in (ROOT / "docs" / "guides" / "gpu.md").read_text()


def test_every_dcgm_series_gets_its_rank(tmp_path: Path) -> None:
    promtool = require("promtool")
    inputs, expected = [], []
    for family in text_string_to_metric_families(RECORDING.read_text()):
        for sample in family.samples:
            inputs.append(
                {"series": _series(sample.name, sample.labels), "values": f"{sample.value:g}x6"}
            )
            if sample.name == "DCGM_FI_DEV_SM_CLOCK":
                run, rank, node = RANKS[sample.labels["UUID"]]
                labels = {**sample.labels, "run": run, "rank": rank, "node": node}
                expected.append({"labels": _series("", labels), "value": sample.value})
    assert len(expected) == 2
    for i, (uuid, (run, rank, node)) in enumerate(RANKS.items()):
        gpu = {"run": run, "rank": rank, "gpu_uuid": uuid, "gpu_index": str(i)}
        gpu.update(gpu_name="NVIDIA H200", pci_bus_id=f"00000000:00:0{6 + i}.0")
        inputs.append({"series": _series("ddp_rank_gpu_info", gpu), "values": "1x6"})
        info = {"run": run, "rank": rank, "node": node}
        inputs.append({"series": _series("ddp_rank_info", info), "values": "1x6"})
    (tmp_path / "rules.yml").write_text(rules.render_rules(FAST))
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": inputs,
                "promql_expr_test": [{"expr": JOIN, "eval_time": "20s", "exp_samples": expected}],
            }
        ],
    }
    (tmp_path / "join.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run(
        [promtool, "test", "rules", "join.yml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
