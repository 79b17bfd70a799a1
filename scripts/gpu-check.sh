#!/usr/bin/env bash
# Prove the exporter's CUDA and NCCL paths on this machine's GPUs, in one command (< 10 min on one):
#   gpu:   tests/gpu but the drills (one NCCL rank; several ranks sharing the GPU over gloo; GPU
#          health from NVML against nvidia-smi, recorded in gpu-health.json),
#   multi: the NCCL drills with one rank per GPU (tests/gpu/test_multi_gpu.py; with one GPU
#          every drill is skipped, with why, in the report),
#   bench: benchmarks/gpu.py (overhead where the GPU and where the host is the bottleneck, the
#          host CPU per step and per bucket, the hook mode's wrapper cost, scrape time) and
#          benchmarks/devicewaits.py (the host cost of timing FSDP2's waits and Work.wait()
#          with CUDA events),
#   cpu:   the core CPU tests with this machine's torch (the torch range: it may be older than
#          the pin),
# then write a markdown report with the versions, every figure and each test's outcome.
#
#   bash scripts/gpu-check.sh [OUT_DIR]        # default: gpu-report/
#   GPU_CHECK_BENCH_ARGS="--regimes host" bash scripts/gpu-check.sh   # a shorter benchmark
#   GPU_CHECK_STEPS="multi" bash scripts/gpu-check.sh OUT   # some steps; the report reads OUT
#
# With two GPUs or more the drills take up to 10 minutes of their own: where one call is bounded
# by that, run GPU_CHECK_STEPS=multi, then GPU_CHECK_STEPS="gpu bench cpu", into the same OUT.
#
# Uses the python3 (and its CUDA torch) already there; installs nothing from the network. Pure-
# Python dependencies missing there can be carried as wheels in .whl/ (docs/how-it-works/compatibility.md).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-report}
PY=${PYTHON:-python3}
STEPS=" ${GPU_CHECK_STEPS:-gpu multi bench cpu} "
for step in $STEPS; do
  case $step in gpu|multi|bench|cpu) ;; *) echo "gpu-check: unknown step '$step' in GPU_CHECK_STEPS (gpu multi bench cpu)" >&2; exit 2 ;; esac
done
mkdir -p "$OUT"
start=$(date +%s)

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/ddp-exporter-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/ddp-exporter-site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$PY" - "$OUT/env.json" <<'PY' || exit 1
import json, subprocess, sys
missing = []
for mod in ("torch", "prometheus_client", "pytest", "pytest_timeout", "yaml"):
    try:
        __import__(mod)
    except ImportError:
        missing.append(mod)
if missing:
    sys.exit(f"gpu-check: missing Python modules {missing}: carry them as wheels in .whl/")
import torch
from exporter.sources.versions import versions
env = {**versions(), "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    env["gpu"] = torch.cuda.get_device_name(0)
try:
    env["driver"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30).stdout.strip()
except (OSError, subprocess.SubprocessError):
    env["driver"] = "unknown"
json.dump(env, open(sys.argv[1], "w"))
print("gpu-check:", env)
if not torch.cuda.is_available():
    sys.exit("gpu-check: torch sees no CUDA device here")
PY

# pytest-timeout ends a stuck test inside pytest, so every job it started is stopped; the outer
# timeout bounds the step (SIGINT: pytest still stops its jobs and writes its report). One
# process (addopts without -n): one GPU, and whatever pytest-xdist that machine has.
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -o addopts=--strict-markers)
if [[ $STEPS == *" gpu "* ]]; then
  GPU_CHECK_OUT="$OUT" timeout -s INT 300 "${PYTEST[@]}" -rA -o timeout=150 tests/gpu \
    --ignore tests/gpu/test_multi_gpu.py --junitxml "$OUT/gpu-tests.xml" 2>&1 \
    | tee "$OUT/gpu-tests.log"
fi
if [[ $STEPS == *" multi "* ]]; then
  # -rA: the drills print what NCCL's RAS and the verdicts said, for the log.
  timeout -s INT 570 "${PYTEST[@]}" -rA -o timeout=150 tests/gpu/test_multi_gpu.py \
    --junitxml "$OUT/multi-gpu-tests.xml" 2>&1 | tee "$OUT/multi-gpu-tests.log"
fi
if [[ $STEPS == *" bench "* ]]; then
  # shellcheck disable=SC2086  # word-split on purpose: extra benchmark arguments
  timeout -s INT 300 "$PY" benchmarks/gpu.py --json "$OUT/bench.json" ${GPU_CHECK_BENCH_ARGS:-} \
    2>&1 | tee "$OUT/bench.log"
  timeout -s INT 120 "$PY" benchmarks/devicewaits.py --json "$OUT/device-waits.json" 2>&1 \
    | tee "$OUT/device-waits.log"
fi
if [[ $STEPS == *" cpu "* ]]; then
  "${PYTEST[@]}" -o timeout=120 tests/test_core.py tests/test_flight.py \
    tests/test_reducer_timing.py tests/test_gradients.py tests/test_blame.py tests/test_hangs.py \
    --junitxml "$OUT/cpu-tests.xml" 2>&1 | tee "$OUT/cpu-tests.log" | tail -3
fi

"$PY" scripts/gpu_report.py "$OUT" $(( $(date +%s) - start )) > "$OUT/report.md"
cat "$OUT/report.md"
