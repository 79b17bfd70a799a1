"""Run ``python -m exporter.mixin generate|check``: the same as ``ddp-exporter mixin``.

An alias of the front door (:mod:`exporter.tools.cli`), which hands the generator its own
parser for the command-line reference page. See :mod:`exporter.generate.command`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..generate import command
from ..generate.command import REPO_ROOT, apply_overrides
from ..tools.cli import build_parser
from ..tools.cli import main as cli_main
from .config import DEFAULT, MixinConfig

__all__ = ["REPO_ROOT", "apply_overrides", "check", "main"]


def check(root: Path | None = REPO_ROOT, cfg: MixinConfig = DEFAULT) -> list[str]:
    """Return diffs where the generated files under ``root`` are stale (every page included)."""
    return command.check(root, cfg, build_parser())


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m exporter.mixin ARGS`` as ``ddp-exporter mixin ARGS``."""
    return cli_main(["mixin", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
