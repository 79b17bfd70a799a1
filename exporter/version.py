"""Hold the exporter's version and home: the one place each is written.

The version is read by the packaging (``pyproject.toml``), ``ddp_rank_info{exporter_version}``,
the OTLP scope, ``ddp-exporter --version`` and the generated compose file.
"""

from __future__ import annotations

__all__ = ["PROJECT_URL", "RUNBOOK_URL", "__version__"]

__version__ = "0.1.0"

#: The project's repository (also ``[project.urls]`` in pyproject.toml).
PROJECT_URL = "https://github.com/ddp-exporter/ddp-exporter"

#: The runbook in the repository: the generated alerts' default ``runbook_url`` base.
RUNBOOK_URL = f"{PROJECT_URL}/blob/main/docs/runbook.md"
