#!/usr/bin/env bash
# Install ddp-exporter and what its tests need on a fresh machine.
# torch first, pinned to the CPU build: a bare "torch" requirement would pull GBs of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0
fi
"$PY" -m pip install -q -e ".[test]"
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
