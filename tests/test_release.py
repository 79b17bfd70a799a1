"""Release basics: one version, an SPDX license shipped in the wheel, metadata twine accepts.

The metadata checks read files (unit); the build runs ``python -m build`` and ``twine check
--strict`` on what it made, as a release would (tool).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from harness import REPO
from release_util import build

from exporter.version import PROJECT_URL, RUNBOOK_URL, __version__

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the package itself needs 3.10
ROOT = Path(REPO)
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


@pytest.mark.unit
def test_one_version_source_and_an_spdx_license() -> None:
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "exporter.version.__version__"
    }
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


@pytest.mark.unit
def test_urls_classifiers_and_changelog() -> None:
    urls = PROJECT["urls"]
    assert all(url.startswith(PROJECT_URL) for url in urls.values()), urls
    assert urls["Runbook"] == RUNBOOK_URL
    classifiers = PROJECT["classifiers"]
    assert "Programming Language :: Python :: 3.11" in classifiers  # the version tested
    assert any(c.startswith("Development Status") for c in classifiers)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "keepachangelog.com" in changelog and "## [Unreleased]" in changelog
    assert set(PROJECT["optional-dependencies"]) >= {"mixin", "otlp", "test"}


@pytest.mark.unit
@pytest.mark.parametrize("script", ["train_ddp.py", "train_fsdp2.py"])
def test_the_examples_give_their_launch_commands(script: str) -> None:
    doc = (ROOT / "examples" / script).read_text()
    assert f"torchrun --nproc-per-node 4 examples/{script}" in doc
    assert re.search(r"exporter\.instrument\(\w+, dataloader=loader, optimizer=opt", doc)
    if script == "train_ddp.py":
        assert "--nnodes 2" in doc and "srun" in doc and "--rdzv-id" in doc


@pytest.mark.tool
def test_build_and_twine_check(tmp_path: Path) -> None:
    sdist, wheel = build(tmp_path)
    assert wheel.name == f"ddp_exporter-{__version__}-py3-none-any.whl"
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.count("PASSED") == 2, proc.stdout + proc.stderr
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        meta = whl.read(f"ddp_exporter-{__version__}.dist-info/METADATA").decode()
    assert f"ddp_exporter-{__version__}.dist-info/licenses/LICENSE" in names
    assert "exporter/tools/cli.py" in names and "exporter/generate/command.py" in names
    assert not [n for n in names if n.startswith(("tests/", "examples/", "dashboards/"))]
    assert "License-Expression: Apache-2.0" in meta and f"Version: {__version__}" in meta
    assert f"Project-URL: Source, {PROJECT_URL}" in meta
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= members
