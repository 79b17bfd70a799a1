"""The compose stack, rehearsed without Docker: what ``docker compose up`` runs, as processes.

Docker cannot run here, so the test runs what the compose file says each service runs, read
from the generated ``docker-compose.yml`` itself (the two cannot drift), with its mounted files:

- ``prometheus`` and ``alertmanager``: Debian's ``prometheus`` and ``prometheus-alertmanager``
  with the service's own command-line flags and the files its volumes mount;
- ``receiver`` and ``trainer``: the service's ``sh -c`` command line, as written, in a fresh
  virtual environment of its own holding nothing but what that command installs (the image
  ``python:3.11-slim`` brings only Python and pip);
- ``grafana`` is not run (no Grafana here); its provisioning is checked elsewhere.

What Docker itself provides is translated, and only that: each volume's container path becomes
a folder of the test (bind mounts map to the generated files, named volumes to a shared
folder, the working directory to a scratch folder); service host names in the mounted
configurations (``alertmanager:9093``, ``receiver:5001``) and the published ports become
127.0.0.1 and free ports (``--web.listen-address``, the receiver's ``--listen``), so the
rehearsal never collides with other servers; ``network_mode: service:prometheus`` is the
loopback both already share. The trainer's ranks serve on their default ports 19400-19402.

The trainer's first step installs torch from the PyTorch CPU index
(``--index-url https://download.pytorch.org/whl/cpu``). Where pip's configuration on this
machine resolves ``torch==2.13.0`` to a local file of the CPU build (a find-links folder), the
test adds that folder to ``PIP_FIND_LINKS`` and sets ``PIP_RETRIES=0`` so that an unreachable
PyTorch index fails its look-ups at once: the command line runs as written, its torch step
served by the local CPU build. Where no local file exists, the command reaches the index itself.

The stack is generated with ``--fast`` (same expressions, short windows) into a copy of the
checkout, as a developer regenerating at the root of a checkout would; the compose file's
``DDP_FAULT=hang`` is set as ``DDP_FAULT=hang docker compose up`` would. The test asserts that
an alert naming the hung rank reaches the printing receiver.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import leftovers
import pytest
import yaml
from harness import Process, free_port, wait_for
from promstack import require
from release_util import source_copy

# The compose file's ranks serve on the default ports: one test at a time may hold them.
pytestmark = [pytest.mark.stack, pytest.mark.xdist_group("default-ports"), pytest.mark.timeout(900)]

HOST_ENV = {"DDP_FAULT": "hang", "DDP_FAULT_RANK": "1"}
RANK_PORTS = (19400, 19401, 19402)


def interpolate(text: str, env: dict[str, str]) -> str:
    """Do compose's interpolation: ``${VAR:-default}``, ``${VAR}``, and ``$$`` for ``$``."""

    def value(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(3) or ""
        return env.get(name) or default

    text = re.sub(r"(?<!\$)\$\{(\w+)(:-([^}]*))?\}", value, text)
    return text.replace("$$", "$")


def translate(text: str, paths: dict[str, str]) -> str:
    """Replace each container path of ``paths`` in ``text`` by its host path, in one pass."""
    alternatives = "|".join(re.escape(d) for d in sorted(paths, key=len, reverse=True))
    pattern = rf"(?<![\w./-])({alternatives})(?=[/\s;\"']|$)"
    return re.sub(pattern, lambda m: paths[m.group(1)], text, flags=re.M)


class Service:
    """One compose service's paths and ports, translated to this machine."""

    def __init__(self, name: str, spec: dict, root: Path, stack: Path, volumes: Path) -> None:
        self.name, self.spec = name, spec
        self.root = root / name
        self.root.mkdir(parents=True)
        self.paths: dict[str, str] = {}
        for volume in spec.get("volumes", []):
            source, dest = volume.split(":")[:2]
            host = stack / source if source.startswith(".") else volumes / source
            host.mkdir(parents=True, exist_ok=True) if not host.exists() else None
            self.paths[dest] = str(host.resolve())
        if "working_dir" in spec:
            self.paths[spec["working_dir"]] = str(self._scratch(spec["working_dir"]))

    def _scratch(self, container_path: str) -> Path:
        path = self.root / container_path.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def path(self, text: str) -> str:
        """Return ``text`` with every mounted container path replaced by its host folder."""
        return translate(text, self.paths)

    def flags(self) -> list[str]:
        """Return the command's flags with paths translated (unmounted ones to scratch)."""
        out = []
        for arg in self.spec["command"]:
            arg = self.path(arg)
            m = re.fullmatch(r"(--[\w.]+=)(/.*)", arg)
            if m and not m.group(2).startswith(str(self.root.parent.parent)):
                arg = m.group(1) + str(self._scratch(m.group(2)))
            out.append(arg)
        return out


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _venv(root: Path) -> dict[str, str]:
    """Create a fresh venv; return the environment that puts its python and pip first."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    # Nothing of this test session leaks in: no checkout on the path, no exporter settings;
    # only the mark that lets the session's end find what outlives the test.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV")
        and (not k.startswith("DDP_EXPORTER_") or k == leftovers.MARK)
    }
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env['PATH']}"
    return env


def _local_torch_folder() -> str | None:
    """Return the folder of the file pip resolves torch==2.13.0 to here, None if not a file."""
    with_report = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--no-deps",
            "--report",
            "-",
            "torch==2.13.0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if with_report.returncode != 0:
        return None
    url = json.loads(with_report.stdout)["install"][0]["download_info"]["url"]
    if not url.startswith("file://"):
        return None
    path = urllib.request.url2pathname(url[len("file://") :])  # "+" arrives as %2B
    return os.path.dirname(path) if "+cpu" in os.path.basename(path) else None


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_docker_compose_up_rehearsed_an_alert_reaches_the_receiver(tmp_path: Path) -> None:
    prometheus, alertmanager = require("prometheus"), require("prometheus-alertmanager")
    stack = source_copy(tmp_path / "stack")
    gen = subprocess.run(
        [sys.executable, "-m", "exporter.mixin", "generate", "--fast", "--out", str(stack)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert gen.returncode == 0, gen.stderr
    compose = yaml.safe_load(interpolate((stack / "docker-compose.yml").read_text(), HOST_ENV))
    services = {
        name: Service(name, spec, tmp_path / "run", stack, tmp_path / "volumes")
        for name, spec in compose["services"].items()
        if name != "grafana"
    }
    assert set(services) == {"prometheus", "alertmanager", "receiver", "trainer"}
    assert compose["services"]["trainer"]["network_mode"] == "service:prometheus"
    ports = {"prometheus": free_port(), "alertmanager": free_port(), "receiver": free_port()}
    hosts = {
        "alertmanager:9093": f"127.0.0.1:{ports['alertmanager']}",
        "receiver:5001": f"127.0.0.1:{ports['receiver']}",
    }

    def mounted(service: Service, container_file: str) -> str:
        """Write a translated copy of a mounted configuration file; return its path."""
        text = Path(service.paths[container_file]).read_text()
        for name, addr in hosts.items():
            text = text.replace(name, addr)
        text = translate(text, service.paths)
        copy = service.root / Path(container_file).name
        copy.write_text(text)
        service.paths[container_file] = str(copy)
        return str(copy)

    torch_folder = _local_torch_folder()
    pip_env = {"PIP_RETRIES": "0"} if torch_folder else {}
    if torch_folder:
        pip_env["PIP_FIND_LINKS"] = " ".join(
            filter(None, [torch_folder, os.environ.get("PIP_FIND_LINKS")])
        )

    def shell(service: Service, port: int | None = None) -> Process:
        spec = service.spec
        assert spec["command"][:2] == ["sh", "-c"], spec["command"]
        line = service.path(spec["command"][2])
        if port is not None:
            line = line.replace("0.0.0.0:5001", f"127.0.0.1:{port}")
        env = _venv(service.root / "venv")
        env.update({k: str(v) for k, v in spec.get("environment", {}).items()}, **pip_env)
        cwd = service.paths[spec["working_dir"]]
        return Process(["sh", "-c", f"cd {cwd} && {line}"], env, name=service.name)

    started: list[Process] = []
    try:
        rx = shell(services["receiver"], ports["receiver"])
        started.append(rx)
        am = services["alertmanager"]
        for flag in am.spec["command"]:
            if flag.startswith("--config.file="):
                mounted(am, flag.split("=", 1)[1])
        started.append(
            Process(
                [
                    alertmanager,
                    *am.flags(),
                    f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
                    f"--storage.path={am.root / 'data'}",
                    "--cluster.listen-address=",
                ],
                dict(os.environ),
                name="alertmanager",
            )
        )
        prom = services["prometheus"]
        for flag in prom.spec["command"]:
            if flag.startswith("--config.file="):
                mounted(prom, flag.split("=", 1)[1])
        started.append(
            Process(
                [
                    prometheus,
                    *prom.flags(),
                    f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
                ],
                dict(os.environ),
                name="prometheus",
            )
        )
        for name in ("alertmanager", "prometheus"):
            wait_for(lambda n=name: _ready(f"http://127.0.0.1:{ports[n]}"), 60, f"{name} ready")
        # The trainer's ranks serve on their default ports: wait until nothing else holds them.
        wait_for(lambda: all(map(_free, RANK_PORTS)), 120, f"ports {RANK_PORTS} to be free")
        trainer = shell(services["trainer"])
        started.append(trainer)
        wait_for(
            lambda: "printing alerts posted to" in rx.text() or rx.poll() is not None,
            600,
            "the receiver to start",
        )
        assert rx.poll() is None, rx.text()[-3000:]

        def alert_line() -> str | None:
            if trainer.poll() is not None:
                raise AssertionError(
                    f"the trainer exited {trainer.poll()}:\n{trainer.text()[-4000:]}"
                )
            return next(
                (line for line in rx.lines if line.startswith("ALERT ") and " rank=1 " in line),
                None,
            )

        try:
            line = wait_for(alert_line, 600, "an alert naming the hung rank at the receiver")
        except AssertionError:
            raise AssertionError(
                f"--- receiver\n{rx.text()[-2000:]}\n--- trainer\n{trainer.text()[-4000:]}"
            ) from None
        assert "run=demo" in line, line
        assert "injecting fault hang" in trainer.text()
    finally:
        for proc in reversed(started):
            proc.stop()
        shutil.rmtree(tmp_path / "run", ignore_errors=True)  # two venvs: about 1 GB
