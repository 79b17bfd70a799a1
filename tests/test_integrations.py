"""exporter.integrations: importing the exporter never imports a framework."""

import subprocess
import sys

from harness import REPO


def test_import_exporter_imports_no_framework():
    code = (
        "import sys, exporter, exporter.integrations\n"
        "heavy = ('lightning', 'pytorch_lightning', 'transformers', 'accelerate')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
