"""Run ``ddp-exporter doctor`` as ``python -m exporter.doctor`` (e.g. ``torchrun ... -m exporter.doctor``).

The doctor itself is :mod:`exporter.tools.doctor`; this module keeps the documented launch
command short for launchers that take a module name.
"""

from __future__ import annotations

import sys

from .tools.doctor import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
