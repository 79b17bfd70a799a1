"""Hold the exporter's version (``ddp_rank_info{exporter_version}``, the OTLP scope)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
