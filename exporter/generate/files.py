"""Collect every generated file of the mixin, keyed by its repository-relative path."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..deploy.alertmanager import render_alertmanager
from ..deploy.kubernetes import render_kubernetes
from ..deploy.sharding import render_sharded
from ..deploy.stack import render_stack
from ..docsite.apiref import render_api
from ..docsite.cliref import render_cli
from ..docsite.reference import PAGES, reference_pages
from ..mixin.config import CONFIG_FILE, DEFAULT, MixinConfig, config_json
from ..mixin.dashboards import render_dashboards
from ..mixin.rules import render_rules
from ..mixin.runbook import render_runbook

__all__ = ["generated_files", "write_files"]


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
    """Write ``files`` under ``root`` (creating folders) and return the paths written."""
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
