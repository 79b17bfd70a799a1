#!/usr/bin/env bash
# Install ddp-exporter and what its tests need on a fresh machine.
# torch first, pinned to the CPU build: a bare "torch" requirement would pull GBs of CUDA wheels.
# (A user installing into their own training environment needs only: pip install ddp-exporter,
# plus the extras they use; this script is the contributors' and CI's set-up.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=torch==2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu
if ! "$PY" -c "import torch" 2>/dev/null; then
  # Which file would pip take? A CPU build (a local copy of PyTorch's CPU wheel) is taken as it
  # is; otherwise (the public index's CUDA build) the CPU build comes from PyTorch's own index,
  # the way PyTorch documents for CPU-only machines.
  found=$("$PY" -m pip install --dry-run --quiet --ignore-installed --no-deps --report - "$TORCH" \
    2>/dev/null | "$PY" -c 'import json, sys
try:
    print(json.load(sys.stdin)["install"][0]["download_info"]["url"])
except Exception:
    pass' || true)
  case "$found" in
    *+cpu*|*%2Bcpu*|*%2bcpu*)
      echo "setup: installing $TORCH, the CPU build pip found at $found"
      "$PY" -m pip install -q "$TORCH" ;;
    *)
      echo "setup: installing $TORCH, the CPU build, from the PyTorch CPU index ($CPU_INDEX)"
      if ! "$PY" -m pip install -q --index-url "$CPU_INDEX" "$TORCH"; then
        echo "setup: the PyTorch CPU index is not reachable; installing $TORCH from the" \
          "configured index instead (on Linux x86_64 that is the CUDA build, several GB)" >&2
        "$PY" -m pip install -q "$TORCH"
      fi ;;
  esac
fi
"$PY" -m pip install -q -e ".[test]"
# The checkout's bytecode, compiled once: where PYTHONDONTWRITEBYTECODE is set, every process the
# suite starts (several hundred ranks) would compile the exporter again, 0.15 s of CPU each.
"$PY" -m compileall -q -j 0 exporter tests examples >/dev/null
# The compose-spec JSON schema for validating docker-compose.yml ships inside this old package;
# --no-deps because its own requirements pin PyYAML below 6.
"$PY" -c "import compose" 2>/dev/null || "$PY" -m pip install -q --no-deps docker-compose==1.29.2
# Prometheus and Alertmanager for promtool/amtool and the end-to-end tests, iproute2, nftables
# and util-linux for the multi-node lab in network namespaces (tests/lab.py; Debian packages).
if ! command -v promtool >/dev/null || ! command -v amtool >/dev/null \
    || ! command -v ip >/dev/null || ! command -v nft >/dev/null || ! command -v tc >/dev/null \
    || ! command -v unshare >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      prometheus prometheus-alertmanager iproute2 nftables util-linux >/dev/null
  else
    echo "setup: install the Debian packages prometheus, prometheus-alertmanager, iproute2," \
      "nftables and util-linux for the full test suite" >&2
  fi
fi
