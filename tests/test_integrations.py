"""exporter.integrations: importing the exporter never imports a framework."""

import subprocess
import sys

import pytest
from harness import REPO


@pytest.mark.tool
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


@pytest.mark.unit
def test_callbacks_reject_bad_arguments():
    pytest.importorskip("transformers")
    pytest.importorskip("lightning")
    from exporter.integrations import lightning as lt
    from exporter.integrations import transformers as hf

    with pytest.raises(TypeError, match="expected a transformers.Trainer"):
        hf.ExporterCallback(object())
    with pytest.raises(TypeError, match="optimizer= is taken from the Trainer"):
        lt.ExporterCallback(optimizer=None)
