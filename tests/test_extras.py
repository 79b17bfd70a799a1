"""A base install never shows a traceback for a missing extra: each extra made unimportable.

Every subcommand's ``--help`` starts with the optional libraries blocked (and the receiver with
torch and prometheus-client blocked too: the compose stack installs it without dependencies);
a command that needs an extra exits 2 with one line naming it; ``instrument(otlp=True)``
without the otlp extra logs one line and serves Prometheus; a framework integration without
its extra is an ImportError naming it. The blocker is a meta-path finder on ``PYTHONPATH``
(``sitecustomize``) that raises ImportError for the blocked modules, as if they were not
installed. The real base install is ``test_wheel_smoke.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO

pytestmark = pytest.mark.tool

EXTRA_MODULES = {
    "mixin": ("yaml", "grafanalib"),
    "otlp": ("opentelemetry",),
    "gpu": ("pynvml",),
    "web": ("yaml", "bcrypt"),
    "lightning": ("lightning",),
    "transformers": ("transformers", "accelerate"),
}
COMMANDS = [
    "",
    "demo",
    "top",
    "hangs",
    "doctor",
    "nodes",
    "mixin",
    "mixin generate",
    "mixin check",
    "receiver",
]

_BLOCKER = """
import os, sys


class _Blocked:
    names = tuple(filter(None, os.environ.get("BLOCKED_MODULES", "").split(",")))

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
"""


@pytest.fixture(scope="module")
def blocker(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("blocker")
    (folder / "sitecustomize.py").write_text(_BLOCKER)
    return folder


def _run(blocker: Path, blocked: tuple[str, ...], *args: str, cwd: Path | None = None):
    env = dict(
        os.environ, PYTHONPATH=f"{blocker}{os.pathsep}{REPO}", BLOCKED_MODULES=",".join(blocked)
    )
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd or REPO,
    )


def test_the_blocker_blocks(blocker: Path) -> None:
    res = _run(blocker, ("yaml",), "-c", "import yaml")
    assert res.returncode == 1 and "No module named 'yaml'" in res.stderr


def test_every_help_without_any_extra(blocker: Path) -> None:
    blocked = tuple(m for mods in EXTRA_MODULES.values() for m in mods)
    for command in COMMANDS:
        res = _run(blocker, blocked, "-m", "exporter.tools.cli", *command.split(), "--help")
        assert res.returncode == 0 and "usage: ddp-exporter" in res.stdout, (command, res.stderr)


def test_the_receiver_runs_without_torch_or_prometheus_client(blocker: Path) -> None:
    blocked = ("torch", "prometheus_client", "yaml", "grafanalib", "opentelemetry")
    res = _run(blocker, blocked, "-m", "exporter.tools.cli", "receiver", "--help")
    assert res.returncode == 0 and "--listen" in res.stdout, res.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "exporter.tools.cli", "mixin", "generate", "--out", "{tmp}"],
        ["-m", "exporter.tools.cli", "mixin", "check"],
        ["-m", "exporter.mixin", "generate", "--out", "{tmp}"],
    ],
    ids=["generate", "check", "python-m-mixin"],
)
@pytest.mark.parametrize("module", EXTRA_MODULES["mixin"])
def test_a_command_needing_the_mixin_extra_says_so_in_one_line(blocker, tmp_path, args, module):
    res = _run(blocker, (module,), *(a.format(tmp=tmp_path) for a in args))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip() == (
        f"ddp-exporter mixin: needs the mixin extra (No module named '{module}'): "
        "pip install 'ddp-exporter[mixin]'"
    )
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_the_demo_stack_without_the_mixin_extra(blocker: Path) -> None:
    import shutil

    if not (shutil.which("prometheus") and shutil.which("prometheus-alertmanager")):
        pytest.skip("prometheus and prometheus-alertmanager not installed: --stack names those")
    res = _run(
        blocker,
        ("yaml",),
        "-m",
        "exporter.tools.cli",
        "demo",
        "--stack",
        "--ranks",
        "1",
        "--port",
        "0",
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().endswith("pip install 'ddp-exporter[mixin]'"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


_OTLP = """
import datetime, logging, socket, urllib.request
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


def test_otlp_asked_for_without_its_extra_is_one_log_line(blocker: Path) -> None:
    res = _run(blocker, EXTRA_MODULES["otlp"], "-c", _OTLP)
    assert res.returncode == 0 and "served" in res.stdout, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if "OTLP" in line]
    assert len(lines) == 1 and "install ddp-exporter[otlp]" in lines[0], res.stderr
    assert "Traceback" not in res.stderr


_GPU = """
import logging
logging.basicConfig(level=logging.INFO, format="%(message)s")
from exporter.sources.gpu.nvml import load_nvml
assert load_nvml() is None
"""


def test_gpu_health_without_its_extra_is_one_log_line(blocker: Path) -> None:
    res = _run(blocker, EXTRA_MODULES["gpu"], "-c", _GPU)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'ddp-exporter[gpu]'" in lines[0], res.stderr


_WEB = """
import datetime, logging, socket, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
import torch, torch.distributed as dist
import exporter
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", web_config=sys.argv[1])
model(torch.ones(1, 2)).sum().backward()
opt.step()
print("trained")
obs.close()
dist.destroy_process_group()
"""


@pytest.mark.parametrize(("blocked", "needs"), [("yaml", "PyYAML"), ("bcrypt", "bcrypt")])
def test_a_web_config_without_its_extra_is_one_log_line_and_nothing_served(
    blocker: Path, tmp_path: Path, blocked: str, needs: str
) -> None:
    config = tmp_path / "web.yml"
    config.write_text("basic_auth_users:\n  prom: $2b$04$" + "a" * 53 + "\n")
    res = _run(blocker, (blocked,), "-c", _WEB, str(config))
    assert res.returncode == 0 and "trained" in res.stdout, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if "WEB_CONFIG" in line]
    assert len(lines) == 1, res.stderr
    assert f"needs {needs}: pip install 'ddp-exporter[web]'" in lines[0], lines
    assert "nothing is served until it is fixed (never in the clear)" in lines[0], lines
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("extra", "blocked"),
    [(extra, module) for extra in ("lightning", "transformers") for module in EXTRA_MODULES[extra]],
)
def test_an_integration_without_its_extra_is_an_import_error_naming_it(
    blocker: Path, extra: str, blocked: str
) -> None:
    code = (
        "try:\n"
        f"    from exporter.integrations.{extra} import ExporterCallback\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    res = _run(blocker, (blocked,), "-c", code)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert f"No module named '{blocked}'" in res.stdout, res.stdout
    assert res.stdout.strip().endswith(f"pip install 'ddp-exporter[{extra}]'"), res.stdout
