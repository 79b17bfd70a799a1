"""Generate or verify the monitoring files: ``ddp-exporter mixin generate|check``.

``generate`` writes the rules, dashboards, Alertmanager and Prometheus configurations, compose
file, Kubernetes and sharded deployments and runbook for one configuration into ``--out`` (the
current directory by default; never the installed package). The repository's checked-in copies
are this command's output at the repository's root; ``check`` regenerates them into a
temporary folder and prints a diff where the files under ``--root`` (the checkout this package
runs from, by default) differ.

``--set`` overrides one :class:`~exporter.mixin.config.MixinConfig` field, e.g.
``--set stalled_for=5m --set slack_webhook_url=https://hooks.slack.com/services/...``;
``--config FILE`` starts from a JSON file of fields (the ``dashboards/mixin.json`` an earlier
run wrote, edited). Every run writes the configuration it used to ``dashboards/mixin.json``:
give it to ``ddp-exporter top --config`` so that the table judges with the thresholds of the
rules. The renderers need the ``mixin`` extra (PyYAML, grafanalib), imported only here.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..mixin.config import DEFAULT, FAST, MixinConfig, load_config

__all__ = ["REPO_ROOT", "add_parser", "apply_overrides", "check", "run"]

#: Modules of the ``mixin`` extra, and what to install for them.
MIXIN_MODULES: tuple[str, ...] = ("yaml", "grafanalib")
MIXIN_EXTRA = "pip install 'ddp-exporter[mixin]'"

#: Where the package's code sits: site-packages for an installed package.
_INSTALLED_IN = Path(__file__).resolve().parents[2]


def _checkout_root() -> Path | None:
    """Return the repository root when this package runs from a checkout, else None."""
    root = _INSTALLED_IN
    if (root / "pyproject.toml").is_file() and (root / "exporter" / "mixin").is_dir():
        return root
    return None


#: The checkout this package runs from (its committed generated files live below it), or None
#: for an installed package.
REPO_ROOT: Path | None = _checkout_root()


def _renderers() -> tuple[Any, Any]:
    """Return ``(generated_files, write_files)``; raises ModuleNotFoundError without the extra."""
    from .files import generated_files, write_files

    return generated_files, write_files


def check(
    root: Path | None = REPO_ROOT,
    cfg: MixinConfig = DEFAULT,
    cli: argparse.ArgumentParser | None = None,
) -> list[str]:
    """Regenerate into a temporary folder and return unified diffs against ``root`` (empty: ok).

    ``cli``: the ``ddp-exporter`` parser, whose reference page is then checked too.
    """
    if root is None:
        raise ValueError("no checkout to compare with: give --root DIR")
    generated_files, write_files = _renderers()
    diffs = []
    files = generated_files(cfg, cli)
    with tempfile.TemporaryDirectory(prefix="ddp-mixin-") as tmp:
        fresh_root = Path(tmp)
        write_files(fresh_root, files)
        for rel in files:
            fresh = (fresh_root / rel).read_text(encoding="utf-8")
            committed_path = Path(root) / rel
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
        number = {float: float, "float": float, int: int, "int": int}.get(types[name])
        try:
            changes[name] = number(raw) if number is not None else raw
        except ValueError:
            want = "a number" if number is float else "a whole number"
            raise ValueError(f"--set {name}: expected {want}, got {raw!r}") from None
    return dataclasses.replace(cfg, **changes)


def _config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="start from this JSON config (a mixin.json the generator wrote)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override one setting, e.g. --set webhook_url=https://... (repeatable)",
    )


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``mixin`` (``generate`` and ``check``) to the ``ddp-exporter`` subcommands."""
    m = sub.add_parser(
        "mixin",
        help="write the alert rules, dashboards and stack files",
        description=__doc__.split("\n\n")[1],
    )
    _actions(m)
    return m


def _actions(m: argparse.ArgumentParser) -> None:
    actions = m.add_subparsers(dest="action", required=True)
    gen = actions.add_parser(
        "generate",
        help="write rules, dashboards, configs, compose file and runbook into --out",
        description="Write the monitoring files for one configuration into --out. A file "
        "there that it did not write is not replaced: exit 2, nothing written (--force "
        "replaces it). Exit 2 without the mixin extra.",
    )
    gen.add_argument(
        "--out", type=Path, default=None, help="output folder (default: the current directory)"
    )
    gen.add_argument(
        "--fast",
        action="store_true",
        help="render the FAST variant (short windows, for tests and drills)",
    )
    gen.add_argument(
        "--force",
        action="store_true",
        help="replace files under --out that the generator did not write (default: refuse)",
    )
    _config_arguments(gen)
    gen.set_defaults(tool=run, parser=gen)
    chk = actions.add_parser(
        "check",
        help="exit 1 with a diff where the generated files under --root are stale",
        description="Regenerate and compare with the files under --root; exit 1 with a diff "
        "where they differ.",
    )
    chk.add_argument(
        "--root",
        type=Path,
        default=None,
        help="folder of the generated files (default: this checkout's root)",
    )
    _config_arguments(chk)
    chk.set_defaults(tool=run, parser=chk)


def run(args: argparse.Namespace) -> int:
    """Run ``mixin generate`` or ``mixin check`` with parsed ``args``; return the exit status."""
    parser = args.parser
    if getattr(args, "fast", False) and args.config:
        parser.error("give --fast or --config, not both")
    try:
        fast = getattr(args, "fast", False)
        base = load_config(args.config) if args.config else FAST if fast else DEFAULT
        cfg = apply_overrides(base, args.set)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        _renderers()
    except ModuleNotFoundError as exc:
        print(f"ddp-exporter mixin: needs the mixin extra ({exc}): {MIXIN_EXTRA}", file=sys.stderr)
        return 2
    if args.action == "generate":
        return _generate(args, cfg)
    root = args.root or REPO_ROOT
    if root is None:
        parser.error("no checkout found to compare with: give --root DIR")
    if not root.is_dir():  # else every file would be "stale", thousands of lines of diff
        parser.error(f"--root: expected the folder of the generated files, {root} is not one")
    diffs = check(root, cfg, _cli(args))
    if diffs:
        sys.stdout.writelines(diffs)
        print(
            f"\n{len(diffs)} generated file(s) are stale: run ddp-exporter mixin generate "
            f"--out {root}",
            file=sys.stderr,
        )
        return 1
    print("generated files are up to date")
    return 0


def _generate(args: argparse.Namespace, cfg: MixinConfig) -> int:
    out = (args.out or Path.cwd()).resolve()
    if REPO_ROOT is None and (out == _INSTALLED_IN or _INSTALLED_IN in out.parents):
        args.parser.error(
            f"--out {out} is inside the installed packages ({_INSTALLED_IN}); write the files "
            "where your monitoring lives, e.g. --out ./monitoring"
        )
    if out.exists() and not out.is_dir():
        args.parser.error(f"--out: expected a folder, {out} is a file")
    generated_files, write_files = _renderers()
    files = generated_files(cfg, _cli(args))
    foreign = [] if args.force else _foreign(out, files)
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        args.parser.error(
            f"--out {out} holds {len(foreign)} file(s) it did not write ({shown}); nothing was "
            "written. Choose a folder of their own, e.g. --out ./monitoring, or --force to "
            "replace them"
        )
    try:
        written = write_files(out, files)
    except OSError as exc:
        args.parser.error(f"--out: cannot write {exc.filename or out}: {exc.strerror or exc}")
    for path in written:
        print(path)
    return 0


def _foreign(out: Path, files: dict[str, str]) -> list[str]:
    from .files import foreign_files

    return foreign_files(out, files)


def _cli(args: argparse.Namespace) -> argparse.ArgumentParser | None:
    """Return a fresh ``ddp-exporter`` parser, built by the front door that parsed ``args``."""
    build = getattr(args, "build_parser", None)
    return build() if build is not None else None
