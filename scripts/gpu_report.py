"""Write scripts/gpu-check.sh's markdown report from the files it left in its output folder.

    python scripts/gpu_report.py OUT_DIR [SECONDS] > OUT_DIR/report.md

Reads ``env.json`` (versions), ``gpu-tests.xml``, ``multi-gpu-tests.xml`` and ``cpu-tests.xml``
(pytest's JUnit XML), ``bench.json`` (benchmarks/gpu.py), ``device-waits.json``
(benchmarks/devicewaits.py) and ``gpu-health.json`` (tests/gpu's NVML reading); a missing file is reported as missing, not skipped over. What the NCCL drills
printed (``multi-gpu-tests.log``: the verdicts, what NCCL's RAS said) follows their table.
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
                if el.get("type") == "pytest.xfail":
                    outcome = "xfail"  # it passed what it asserts, and says what is not there yet
                detail = (
                    (el.get("message") or "").splitlines()[0][:400] if el.get("message") else ""
                )
                break
        rows.append((name, outcome, detail))
    return rows


def _table(title: str, path: Path) -> list[str]:
    if not path.exists():
        return [
            f"## {title}",
            "",
            f"missing: {path.name} (the step did not run, or not to its end)",
            "",
        ]
    rows = _tests(path)
    counts: dict[str, int] = {}
    for _, outcome, _ in rows:
        counts[outcome] = counts.get(outcome, 0) + 1
    out = [
        f"## {title}",
        "",
        ", ".join(f"{n} {o}" for o, n in sorted(counts.items())),
        "",
        "| test | outcome | detail |",
        "|---|---|---|",
    ]
    out += [f"| `{n}` | {o} | {d.replace('|', '/')} |" for n, o, d in rows]
    return [*out, ""]


#: Lines kept of each drill's printed output.
MAX_PRINTED = 80


def _printed(path: Path) -> list[str]:
    """Return what each test printed (pytest ``-rA``'s captured stdout), for the report."""
    if not path.exists():
        return []
    out: list[str] = []
    name, block = "", None
    for line in path.read_text(errors="replace").splitlines():
        if block is not None and not line.startswith(("-----", "_____", "=====")):
            block.append(line)
            continue
        if block is not None:  # the next section, test or summary ends the block
            out += _kept(block)
            block = None
        if line.startswith("_") and line.endswith("_") and " test" in line:
            name = line.strip("_ ")
        elif line.startswith("-") and "Captured stdout call" in line:
            block = []
            out += ["", f"`{name}`:", "", "```text"]
    if block is not None:
        out += _kept(block)
    return ["What the drills printed:", *out, ""] if out else []


def _kept(block: list[str]) -> list[str]:
    """Return a printed block's first lines, and how many more there were, closing its fence."""
    while block and not block[-1].strip():
        block.pop()
    kept = block[:MAX_PRINTED]
    more = len(block) - len(kept)
    return [*kept, *([f"... {more} more lines"] if more else []), "```"]


def _regime_row(r: dict) -> str:
    """Return one regime's row: its shape, bottleneck, overhead, control and host cost."""
    i, c = r["ratio"]["instr"], r["ratio"]["control"]
    cpu = r["cpu_us_per_step"]
    return (
        f"| {r['regime']} | {r['params'] / 1e6:.0f} M, batch {r['batch']}, "
        f"{r['buckets_per_step']} buckets | {r['plain_step_ms']:.1f} ms | {r.get('block', '?')} | "
        f"{r['kernel_share']:.2f} / {r['issue_share']:.2f} | **{i['median']:.4f}** [{i['q1']:.4f}, {i['q3']:.4f}] | "
        f"{c['median']:.4f} [{c['q1']:.4f}, {c['q3']:.4f}] | "
        f"{cpu['main_cpu']['instr_minus_plain']:+.0f} / "
        f"{cpu['autograd_cpu']['instr_minus_plain']:+.0f} µs "
        f"({r['autograd_us_per_bucket']:+.1f} µs per bucket) | {r['comm_timing']} | "
        f"{r['exporter_errors'] or 'none'} |"
    )


def _bench(path: Path) -> list[str]:
    if not path.exists():
        return ["## benchmarks/gpu.py", "", "missing: bench.json (see bench.log)", ""]
    b = json.loads(path.read_text())
    out = [
        "## benchmarks/gpu.py",
        "",
        f"{b['backend']} (1 rank), AMP {b['amp']}; {b['rounds']} interleaved rounds of a "
        "block of steps on every arm, in each of the six orders in turn. kernel share: the "
        "GPU's busy time per step over the plain step; issue share: the part of the wall time "
        "the host takes to issue the steps (kernel share near 1 alone: the GPU is the "
        "bottleneck; issue share near 1: the host is). Host CPU per step, instr minus plain: "
        "the training thread / the autograd engine's thread.",
        "",
        "| regime | model | plain step | steps per block | kernel / issue share | "
        "instr/plain (median, IQR) | control/plain | host CPU per step | comm_timing | "
        "exporter errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(_regime_row(r) for r in b["regimes"]),
        "",
    ]
    if "hook_bucket" in b:
        h = b["hook_bucket"]
        out += [
            f"Hook mode's wrapper per bucket, host side: {h['cost_us']:.1f} µs (bare hook "
            f"{h['bare_us']:.1f} µs).",
            "",
        ]
    for r in b["regimes"]:
        if "scrape_ms" in r and "idle" in r["scrape_ms"]:
            s = r["scrape_ms"]
            out += [
                f"/metrics scrape: idle {s['idle']['median']:.2f} ms, while training "
                f"{s['training']['median']:.2f} ms ({s['bytes']} bytes).",
                "",
            ]
    return out


def _device_waits(path: Path) -> list[str]:
    title = "## benchmarks/devicewaits.py"
    if not path.exists():
        return [title, "", "missing: device-waits.json (see device-waits.log)", ""]
    d = json.loads(path.read_text())
    lines = [
        title,
        "",
        f"Timing the compute stream's waits ({d['events']} events), host time per FSDP2 "
        f"all-gather wait: FSDP2's own {d['bare_us']:.2f} µs; the exporter adds "
        f"{d['not_timed_us']:.2f} µs on a step it does not time, {d['timed_us']:.2f} µs on a "
        f"step it times; {d['amortised_us']:.2f} µs per wait at one step in {d['every']}; "
        f"errors {d['errors']}.",
        "",
    ]
    # The other waits the benchmark measures (absent from reports made before their arm).
    for key, what in (("work_wait", "`Work.wait()`"), ("classic_fsdp", "classic FSDP wait")):
        w = d.get(key)
        if w:
            lines += [
                f"Per {what}: the exporter adds {w['not_timed_us']:.2f} µs on a step it does "
                f"not time, {w['timed_us']:.2f} µs on a step it times; "
                f"{w['amortised_us']:.2f} µs per wait.",
                "",
            ]
    parts = d.get("parts")
    if parts:  # where a timed wait's host time goes
        lines += [
            f"Per call of the event source: `usable()` {parts['usable_us']:.2f} µs, "
            f"`on_default_stream()` {parts['on_default_stream_us']:.2f} µs, `record()` "
            f"{parts['record_us']:.2f} µs (twice per timed wait).",
            "",
        ]
    return lines


def _health(path: Path) -> list[str]:
    if not path.exists():
        return ["## GPU health (NVML)", "", "missing: gpu-health.json (see gpu-tests.log)", ""]
    h = json.loads(path.read_text())
    r = h["reading"]
    gpu = r["identity"]
    return [
        "## GPU health (NVML)",
        "",
        f"{gpu['name']} {gpu['uuid']} at {gpu['pci_bus_id']}: SM "
        f"{(r['sm_clock_hz'] or 0) / 1e6:.0f} of {(r['sm_clock_max_hz'] or 0) / 1e6:.0f} MHz, "
        f"{r['temperature_celsius']} °C, {r['power_watts']} of {r['power_limit_watts']} W, "
        f"clock events {r['clock_events']}, ECC {r['ecc_errors']}, remapped rows "
        f"{r['remapped_rows']}, PCIe replays {r['pcie_replays']}, NVLink {r['nvlink_errors']}; "
        f"Xid events watched: {h['xid_watch']}. One reading: {h['read_us']:.0f} µs "
        "(at scrape time, on the endpoint's thread).",
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
        *_table("NCCL drills, one rank per GPU", out / "multi-gpu-tests.xml"),
        *_printed(out / "multi-gpu-tests.log"),
        *_health(out / "gpu-health.json"),
        *_bench(out / "bench.json"),
        *_device_waits(out / "device-waits.json"),
        *_table("core CPU tests with this torch", out / "cpu-tests.xml"),
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
