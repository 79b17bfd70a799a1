"""Generate or verify the committed monitoring files.

Usage::

    python -m exporter.mixin generate [--out DIR] [--fast] [--config FILE] [--set FIELD=VALUE ...]
    python -m exporter.mixin check      # exit 1 with a diff if the committed files are stale

``--set`` overrides one :class:`~exporter.mixin.config.MixinConfig` field, e.g.
``--set stalled_for=5m --set webhook_url=http://hooks.internal/ddp`` for your own deployment;
``--config FILE`` starts from a JSON file of fields (the ``dashboards/mixin.json`` an earlier run
wrote, edited). Every run writes the configuration it used to ``dashboards/mixin.json``: give it to
``ddp-exporter top --config`` so that the table judges with the thresholds of the rules.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .config import DEFAULT, FAST, MixinConfig, load_config
from .files import generated_files, write_files

__all__ = ["REPO_ROOT", "apply_overrides", "check", "main"]

#: Repository root: the committed generated files live below it.
REPO_ROOT = Path(__file__).resolve().parents[2]


def check(root: Path = REPO_ROOT) -> list[str]:
    """Regenerate into a temporary folder and return unified diffs against ``root`` (empty: ok)."""
    diffs = []
    with tempfile.TemporaryDirectory(prefix="ddp-mixin-") as tmp:
        fresh_root = Path(tmp)
        write_files(fresh_root, generated_files(DEFAULT))
        for rel in generated_files(DEFAULT):
            fresh = (fresh_root / rel).read_text(encoding="utf-8")
            committed_path = root / rel
            committed = (
                committed_path.read_text(encoding="utf-8") if committed_path.exists() else ""
            )
            if fresh != committed:
                diffs.append(
                    "".join(
                        difflib.unified_diff(
                            committed.splitlines(keepends=True),
                            fresh.splitlines(keepends=True),
                            fromfile=f"committed/{rel}",
                            tofile=f"generated/{rel}",
                        )
                    )
                    or f"missing: {rel}\n"
                )
    return diffs


def apply_overrides(cfg: MixinConfig, pairs: Sequence[str]) -> MixinConfig:
    """Return ``cfg`` with ``FIELD=VALUE`` overrides applied (values typed like the field)."""
    types = {f.name: f.type for f in dataclasses.fields(MixinConfig)}
    changes: dict[str, object] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in types:
            raise ValueError(
                f"--set expects FIELD=VALUE with FIELD one of {sorted(types)}: {pair!r}"
            )
        changes[name] = (
            float(raw)
            if types[name] in (float, "float")
            else int(raw)
            if types[name] in (int, "int")
            else raw
        )
    return dataclasses.replace(cfg, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m exporter.mixin", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write rules, dashboards, configs, runbook")
    gen.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: repo)")
    gen.add_argument(
        "--fast", action="store_true", help="render the FAST variant (short windows, for tests)"
    )
    gen.add_argument(
        "--config", type=Path, default=None, help="start from this JSON config (mixin.json)"
    )
    gen.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="override a setting"
    )
    sub.add_parser("check", help="exit 1 with a diff if the committed files are stale")
    args = parser.parse_args(argv)
    if args.command == "generate":
        if args.fast and args.config:
            parser.error("give --fast or --config, not both")
        try:
            base = load_config(args.config) if args.config else FAST if args.fast else DEFAULT
            cfg = apply_overrides(base, args.set)
        except ValueError as exc:
            parser.error(str(exc))
        written = write_files(args.out, generated_files(cfg))
        for path in written:
            print(path)
        return 0
    diffs = check()
    if diffs:
        sys.stdout.writelines(diffs)
        print(
            f"\n{len(diffs)} generated file(s) are stale: run python -m exporter.mixin generate",
            file=sys.stderr,
        )
        return 1
    print("generated files are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
