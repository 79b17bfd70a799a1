"""Build the package the way a release does, from a copy of this working tree.

Shared by the release checks and the wheel smoke test: the copy holds the files git tracks or
would track (what a fresh clone has, plus new files not yet committed), so a build never writes
into the checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from harness import REPO


def source_copy(dest: Path) -> Path:
    """Copy the working tree's tracked and unignored files to ``dest``; return it."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=60,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        src = Path(REPO) / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def build(tmp: Path) -> tuple[Path, Path]:
    """Build the sdist and, from it, the wheel with ``python -m build``; return both paths."""
    src = source_copy(tmp / "src")
    out = tmp / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel
