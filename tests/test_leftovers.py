"""The session-wide check: a test that leaves a process running fails the run, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from harness import REPO

from exporter.tools.reaper import Proc

pytestmark = pytest.mark.tool

TESTS = os.path.join(REPO, "tests")


def _inner_env() -> dict[str, str]:
    """The environment of the inner session: this session's own options are not its own."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return dict(env, PYTHONPATH=REPO, DDP_EXPORTER_TEST_LEFTOVER_GRACE="1")


def test_a_leaked_process_fails_the_session_and_is_named(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {TESTS!r})\n"
        "from leftovers import pytest_runtest_setup, pytest_sessionfinish  # noqa: F401\n"
    )
    (tmp_path / "test_leak.py").write_text(
        textwrap.dedent(
            """
            import subprocess, sys

            def test_leaks():
                p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                     start_new_session=True)
                print("LEAKED", p.pid)

            def test_clean():
                subprocess.run([sys.executable, "-c", "pass"], check=True)
            """
        )
    )
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=_inner_env(),
    )
    out = res.stdout + res.stderr
    leaked = int(out.split("LEAKED ")[1].split()[0])
    assert res.returncode == 1, out
    assert "1 process(es) started by the tests are still running" in out, out
    assert f"pid {leaked} from test_leak.py::test_leaks" in out, out
    assert "test_clean" not in out.split("still running")[1], out
    assert Proc.of(leaked) is None  # and it was killed
