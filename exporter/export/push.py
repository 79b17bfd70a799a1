"""Start the OTLP push path when asked to, without requiring its optional dependencies."""

from __future__ import annotations

from typing import Any

from .. import settings
from ..errors import ErrorCounter
from ..log import log

__all__ = ["start"]


def start(
    otlp: bool | str, identity: settings.Identity, registry: Any, errors: ErrorCounter
) -> Any:
    """Return a started pusher of ``registry`` (``otlp``: True or an endpoint URL), else None.

    A missing ``ddp-exporter[otlp]`` extra is logged once and leaves Prometheus serving; a
    pusher that fails to start is counted in ``errors``.
    """
    if otlp is False:
        return None
    try:
        from .otlp import start_push
    except ImportError as exc:
        log.error(
            "ddp-exporter: OTLP push requested but unavailable (%s); install "
            "ddp-exporter[otlp]. Prometheus metrics are still served.",
            exc,
        )
        return None
    try:
        return start_push(identity, registry, errors, otlp if isinstance(otlp, str) else None)
    except Exception as exc:  # noqa: BLE001 - a bad collector must not stop training
        errors.record("collect", exc)
        return None
