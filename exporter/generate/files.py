"""Collect every generated file of the mixin, keyed by its repository-relative path."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from ..deploy.alertmanager import render_alertmanager
from ..deploy.kubernetes import render_kubernetes
from ..deploy.sharding import render_sharded
from ..deploy.stack import render_stack
from ..docsite.apiref import render_api
from ..docsite.cliref import render_cli
from ..docsite.reference import PAGES, reference_pages
from ..mixin.config import CONFIG_FILE, DEFAULT, MixinConfig, config_json
from ..mixin.dashboards import render_dashboards
from ..mixin.render import GENERATED_BY
from ..mixin.rules import render_rules
from ..mixin.runbook import render_runbook

__all__ = ["foreign_files", "generated_files", "write_files"]


def generated_files(
    cfg: MixinConfig = DEFAULT, cli: argparse.ArgumentParser | None = None
) -> dict[str, str]:
    """Return ``{repo-relative path: text}`` of everything the generator writes.

    ``cli`` is the ``ddp-exporter`` parser (the front door, :mod:`exporter.tools.cli`, builds it
    and hands it down: the tools sit above this module), whose reference page is written from
    it; without it that page is left out. The other reference pages document the code and the
    default configuration, whatever ``cfg`` is.
    """
    out = {f"dashboards/grafana/{name}": text for name, text in render_dashboards(cfg).items()}
    out["dashboards/prometheus/rules.yml"] = render_rules(cfg)
    out["dashboards/alertmanager/alertmanager.yml"] = render_alertmanager(cfg)
    out["docs/runbook.md"] = render_runbook(cfg)
    out.update(reference_pages())
    out[f"{PAGES}/api.md"] = render_api()
    if cli is not None:
        out[f"{PAGES}/cli.md"] = render_cli(cli)
    out.update(render_stack(cfg))
    out.update(render_kubernetes(cfg))
    out.update(render_sharded(cfg))
    out[CONFIG_FILE] = config_json(cfg)
    return dict(sorted(out.items()))


def write_files(root: Path, files: dict[str, str]) -> list[Path]:
    """Write ``files`` under ``root`` (creating folders) and return the paths written.

    Every file is staged beside its place first and moved into it only once all are staged, so
    a write that fails (a full disk, a folder in the way) leaves the files as they were: none
    cut short, no tree half old and half new. A file keeps its permissions; a link is followed.
    """
    staged: list[tuple[Path, Path]] = []
    try:
        for rel, text in files.items():
            dest = (root / rel).resolve()
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_dir():
                raise IsADirectoryError(errno.EISDIR, "a folder is in the way", str(dest))
            staging = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            staged.append((staging, dest))
            _stage(staging, text, dest)
        for staging, dest in staged:
            os.replace(staging, dest)
    finally:
        for staging, _ in staged:
            staging.unlink(missing_ok=True)
    return [root / rel for rel in files]


def _stage(staging: Path, text: str, dest: Path) -> None:
    """Write ``text`` to ``staging`` with the mode ``dest`` has (a new file's: the umask's)."""
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    with contextlib.suppress(FileNotFoundError):
        os.chmod(staging, stat.S_IMODE(dest.stat().st_mode))


def foreign_files(root: Path, files: dict[str, str]) -> list[str]:
    """Return the paths of ``files`` that exist under ``root`` and were not written by the
    generator: a project's own ``docker-compose.yml`` or ``docs/runbook.md``, which writing
    there would replace."""
    return [rel for rel, text in files.items() if not _ours(root / rel, text)]


def _ours(path: Path, text: str) -> bool:
    """Say whether ``path`` is no file yet or holds what the generator writes there."""
    if not path.is_file():
        return True  # nothing to lose; a folder or a file in its way fails the write, clearly
    try:
        found = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if found == text or GENERATED_BY in found:
        return True
    # JSON takes no comment: a dashboard carries the product's tag, the configuration its key,
    # the file_sd example its own shape.
    try:
        doc: Any = json.loads(found)
    except ValueError:
        return False
    if isinstance(doc, dict):
        return "ddp_exporter_mixin" in doc or "ddp-exporter" in (doc.get("tags") or [])
    return path.name.endswith(".example.json") and all(
        isinstance(item, dict) and "targets" in item for item in doc
    )
