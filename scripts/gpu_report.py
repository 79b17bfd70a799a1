"""Write scripts/gpu-check.sh's markdown report from the files it left in its output folder.

    python scripts/gpu_report.py OUT_DIR [SECONDS] > OUT_DIR/report.md

Reads ``env.json`` (versions), ``gpu-tests.xml`` and ``cpu-tests.xml`` (pytest's JUnit XML) and
``bench.json`` (benchmarks/gpu.py); a missing file is reported as missing, not skipped over.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def _tests(path: Path) -> list[tuple[str, str, str]]:
    """Return ``(test, outcome, detail)`` for each test case of a JUnit XML file."""
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
                detail = (
                    (el.get("message") or "").splitlines()[0][:160] if el.get("message") else ""
                )
                break
        rows.append((name, outcome, detail))
    return rows


def _table(title: str, path: Path) -> list[str]:
    if not path.exists():
        return [f"## {title}", "", f"missing: {path.name} (the step did not run to its end)", ""]
    rows = _tests(path)
    counts: dict[str, int] = {}
    for _, outcome, _ in rows:
        counts[outcome] = counts.get(outcome, 0) + 1
    out = [f"## {title}", "", ", ".join(f"{n} {o}" for o, n in sorted(counts.items())), "",
           "| test | outcome | detail |", "|---|---|---|"]  # fmt: skip
    out += [f"| `{n}` | {o} | {d.replace('|', '/')} |" for n, o, d in rows]
    return [*out, ""]


def _bench(path: Path) -> list[str]:
    if not path.exists():
        return ["## benchmarks/gpu.py", "", "missing: bench.json (see bench.log)", ""]
    b = json.loads(path.read_text())
    r, c, bk, s = b["ratio"]["instr"], b["ratio"]["control"], b["bucket"], b["scrape_ms"]
    return [
        "## benchmarks/gpu.py",
        "",
        f"{b['params'] / 1e6:.0f} M parameters, batch {b['batch']}, AMP {b['amp']}, "
        f"{b['backend']} (1 rank), plain step {b['plain_step_ms']:.1f} ms; "
        f"comm_timing={b['comm_timing']}, in-flight source {b['inflight_source']}; "
        f"{b['rounds']} rounds x {b['block']} steps per arm.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| overhead ratio instr/plain (median, IQR) | **{r['median']:.4f}** "
        f"[{r['q1']:.4f}, {r['q3']:.4f}] |",
        f"| noise floor control/plain (median, IQR) | {c['median']:.4f} "
        f"[{c['q1']:.4f}, {c['q3']:.4f}] |",
        f"| timing wrapper per bucket, host side | {bk['cost_us']:.1f} µs "
        f"(bare hook {bk['bare_us']:.1f} µs) |",
        f"| /metrics scrape, idle (median) | {s['idle']['median']:.2f} ms ({s['bytes']} bytes) |",
        f"| /metrics scrape while training (median) | {s['training']['median']:.2f} ms |",
        f"| buckets timed / steps counted (instr) | {b['buckets_timed']} / "
        f"{b['instr_steps_counted']} |",
        f"| exporter errors | {b['exporter_errors'] or 'none'} |",
        "",
    ]


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    seconds = argv[2] if len(argv) > 2 else "?"
    env_path = out / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    lines = [
        "# ddp-exporter GPU check",
        "",
        f"GPU {env.get('gpu', '?')} (driver {env.get('driver', '?')}); torch "
        f"{env.get('torch_version', '?')}, CUDA {env.get('cuda_version', '?')}, NCCL "
        f"{env.get('nccl_version', '?')}, Python {env.get('python_version', '?')}; "
        f"whole check {seconds} s.",
        "",
        *_table("tests/gpu", out / "gpu-tests.xml"),
        *_bench(out / "bench.json"),
        *_table("core CPU tests with this torch", out / "cpu-tests.xml"),
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
