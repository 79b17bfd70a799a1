"""Hold the exporter's one logger (``logging.getLogger("exporter")``)."""

from __future__ import annotations

import logging

__all__ = ["log"]

#: Every part of the exporter logs here; applications configure it like any other logger.
log = logging.getLogger("exporter")
