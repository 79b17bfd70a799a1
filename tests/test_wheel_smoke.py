"""The wheel as a user installs it: a fresh virtual environment outside the checkout.

Built with ``python -m build`` from a copy of this tree, installed into a new venv with the CPU
build of torch first (``pip install torch==2.13.0``: the CPU wheel where pip's configuration
offers it, as ``scripts/setup.sh`` arranges) and no extras. Then, with that venv's own
``ddp-exporter`` and nothing of the checkout on the path: every subcommand's ``--help``; the
one-line message (exit 2) of each command that needs an extra, never a traceback; a 2-rank
torchrun of ``examples/train_ddp.py`` whose ``/metrics`` answer; then with ``[mixin]``:
``mixin generate --out`` into a temporary folder, ``promtool check rules`` and ``amtool
check-config`` on what it wrote, and nothing written into site-packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from harness import REPO, default_signals, free_port, wait_for
from promstack import require
from release_util import build

from exporter.tools.demo import metrics_urls
from exporter.tools.reaper import stop_tree

# Building the wheel and installing torch into a fresh venv took 285 s beside a loaded suite: the
# bound only ends a stuck run.
pytestmark = pytest.mark.timeout(900)

TORCH = "torch==2.13.0"
COMMANDS = [
    "demo",
    "run",
    "top",
    "hangs",
    "doctor",
    "nodes",
    "mixin",
    "mixin generate",
    "mixin check",
    "receiver",
]


class Venv:
    """A fresh virtual environment holding the built wheel and what it pulled in."""

    def __init__(self, root: Path, wheel: Path) -> None:
        self.root, self.wheel = root, wheel
        self.bin = root / "venv" / "bin"
        self.work = root / "work"  # the user's folder: outside the checkout
        self.work.mkdir()
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
        self.pip(TORCH)  # first: a bare torch requirement would pull the CUDA build
        self.pip(str(wheel))
        self.site = Path(
            self.python(
                "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
            ).stdout.strip()
        )

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(PATH=f"{self.bin}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1")
        return env

    def run(self, *cmd: str, timeout: float = 120, cwd: Path | None = None):
        return subprocess.run(
            list(cmd),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or self.work,
            env=self.env(),
        )

    def python(self, *args: str):
        return self.run(str(self.bin / "python"), *args)

    def pip(self, *args: str) -> None:
        proc = self.run(str(self.bin / "python"), "-m", "pip", "install", "-q", *args, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    def cli(self, *args: str, cwd: Path | None = None):
        return self.run(str(self.bin / "ddp-exporter"), *args, cwd=cwd)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel-smoke")
    try:
        _, wheel = build(root)
        yield Venv(root, wheel)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # about 1 GB: never left for pytest to keep


def _tree(site: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in site.rglob("*") if "__pycache__" not in p.parts}


# A job: a fresh venv with torch installed, and a training process (the OTLP check) from it.
@pytest.mark.job
def test_base_install_every_command_then_the_mixin_extra(venv: Venv) -> None:
    # The package runs from the venv, not from the checkout.
    where = venv.python("-c", "import exporter; print(exporter.__file__)").stdout
    assert where.startswith(str(venv.site)) and REPO not in where, where
    version = venv.cli("--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("ddp-exporter 0."), version
    assert venv.cli("--help").returncode == 0
    for command in COMMANDS:
        res = venv.cli(*command.split(), "--help")
        assert res.returncode == 0 and "usage: ddp-exporter" in res.stdout, (command, res.stderr)
    # `run` arms the job's processes through the sitecustomize the wheel ships.
    armed = venv.cli("run", "--no-stack", "--", str(venv.bin / "python"), "-c", _ARMED)
    assert armed.returncode == 0 and armed.stdout.startswith(str(venv.site)), armed
    # Commands that need an extra: one line, exit 2, never a traceback.
    needing = [["mixin", "generate", "--out", "gen"], ["mixin", "check", "--root", "gen"]]
    if shutil.which("prometheus") and shutil.which("prometheus-alertmanager"):
        needing.append(["demo", "--stack", "--ranks", "1"])  # else it names the binaries
    for args in needing:
        res = venv.cli(*args)
        line = "pip install 'ddp-exporter[mixin]'"
        assert res.returncode == 2 and line in res.stderr, (args, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    # OTLP asked for without the otlp extra: one line from the training process, metrics served.
    otlp = venv.python("-c", _OTLP_WITHOUT_EXTRA)
    assert otlp.returncode == 0 and "served" in otlp.stdout, otlp.stdout + otlp.stderr
    assert "install ddp-exporter[otlp]" in otlp.stderr and "Traceback" not in otlp.stderr

    venv.pip(f"{venv.wheel}[mixin]")
    before = _tree(venv.site)
    out = venv.work / "monitoring"
    res = venv.cli(
        "mixin",
        "generate",
        "--out",
        str(out),
        "--set",
        "slack_webhook_url=https://hooks.slack.com/services/T0/B0/X",
    )
    assert res.returncode == 0, res.stderr
    for rel in (
        "dashboards/prometheus/rules.yml",
        "dashboards/alertmanager/alertmanager.yml",
        "dashboards/prometheus/prometheus.yml",
        "docker-compose.yml",
        "docs/runbook.md",
        "dashboards/grafana/overview.json",
        "dashboards/mixin.json",
    ):
        assert (out / rel).is_file(), rel
    # Without --out: the current directory.
    assert venv.cli("mixin", "generate", cwd=venv.work).returncode == 0
    assert (venv.work / "docker-compose.yml").is_file()
    # Never into the installed package, even when run from there.
    refused = venv.cli("mixin", "generate", cwd=venv.site)
    assert refused.returncode == 2 and "inside the installed packages" in refused.stderr
    assert _tree(venv.site) == before, "something was written into site-packages"
    # A folder generated earlier is checked against this version with --root.
    assert venv.cli("mixin", "check", "--root", str(venv.work)).returncode == 0
    promtool, amtool = require("promtool"), require("amtool")
    rules = subprocess.run(
        [promtool, "check", "rules", str(out / "dashboards/prometheus/rules.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rules.returncode == 0 and "SUCCESS" in rules.stdout, rules.stdout + rules.stderr
    am = subprocess.run(
        [amtool, "check-config", str(out / "dashboards/alertmanager/alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert am.returncode == 0 and "SUCCESS" in am.stdout, am.stdout + am.stderr


_ARMED = "import sys; print(sys.modules['sitecustomize'].__file__)"

_OTLP_WITHOUT_EXTRA = """
import datetime, socket, urllib.request
import torch, torch.distributed as dist
import exporter
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
obs = exporter.instrument(torch.nn.Linear(2, 2), port=0, addr="127.0.0.1", otlp=True)
with urllib.request.urlopen(f"http://127.0.0.1:{obs.port}/metrics", timeout=10) as r:
    assert b"ddp_rank_info" in r.read()
print("served")
obs.close()
dist.destroy_process_group()
"""


@pytest.mark.job
def test_the_installed_package_instruments_the_example_under_torchrun(venv: Venv) -> None:
    cmd = [
        str(venv.bin / "torchrun"),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(Path(REPO) / "examples" / "train_ddp.py"),
        "--epochs",
        "2",
        "--checkpoint",
        str(venv.work / "ck.pt"),
    ]
    env = dict(
        venv.env(),
        DDP_EXPORTER_PORT="0",
        DDP_EXPORTER_FINAL_SCRAPE_S="0",
        OMP_NUM_THREADS="1",
        DDP_EXPORTER_DUMP_DIR=str(venv.work / "dumps"),
    )
    lines: list[str] = []
    with default_signals():
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=venv.work,
            start_new_session=True,
        )
    try:
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        urls = wait_for(
            lambda: len(metrics_urls("".join(lines))) == 2 and metrics_urls("".join(lines)),
            180,
            "both ranks' metrics URLs",
        )
        for url in urls.values():
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = resp.read().decode()
            assert "ddp_steps_total" in body and 'parallelism="ddp"' in body
        assert proc.wait(timeout=240) == 0, "".join(lines)[-3000:]
    finally:
        stop_tree(proc)
    reader.join(timeout=10)
    assert "epoch 1: loss" in "".join(lines)
