"""Run ``python -m exporter.mixin generate|check``: the same as ``ddp-exporter mixin``.

See :mod:`exporter.mixin.command`.
"""

from __future__ import annotations

import sys

from .command import REPO_ROOT, apply_overrides, check, main

__all__ = ["REPO_ROOT", "apply_overrides", "check", "main"]

if __name__ == "__main__":
    sys.exit(main())
