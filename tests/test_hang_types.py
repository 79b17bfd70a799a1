"""The typed packages type-check: mypy, strict, over the settings, the /proc reader, the network
(exporter/network/), the hang protocol (exporter/hangs/), the sources (exporter/sources/) and
the doctor (exporter/tools/doctor/) ([tool.mypy] in pyproject).

A drift between what one rank writes and another reads (a renamed field, a number read as a
string, a summary where an ack was meant) is a type error before it is a silent mis-diagnosis;
so is a hook fed the wrong shape of event on the training path.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from harness import REPO, child_env

pytestmark = pytest.mark.tool


def test_mypy_strict_passes_on_the_typed_packages(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]' installs it)")
    # The configuration is pyproject's [tool.mypy]; the cache stays out of the checkout.
    res = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=child_env(),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Success: no issues found" in res.stdout, res.stdout
