"""Ask Prometheus's HTTP API: the one client of the tools, the tests, benchmarks and scripts."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["api", "instant_query"]


def api(
    url: str,
    path: str,
    params: dict[str, Any] | None = None,
    *,
    timeout: float = 5.0,
    post: bool = False,
) -> Any:
    """Call ``path`` (e.g. ``/api/v1/rules``) of Prometheus at ``url``; return its ``data``.

    ``post`` sends the parameters as a form (long queries); raises RuntimeError when Prometheus
    answers with an error status (an HTTP error it answers with a body included).
    """
    query = urllib.parse.urlencode(params or {})
    full = f"{url.rstrip('/')}{path}"
    request = (
        urllib.request.Request(full, data=query.encode())
        if post
        else urllib.request.Request(f"{full}?{query}" if query else full)
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - a URL given
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
        except ValueError:
            raise RuntimeError(f"Prometheus {path} failed: HTTP {exc.code}") from None
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus {path} failed: {body.get('error', body)}")
    return body["data"]


def instant_query(
    url: str, expr: str, timeout: float = 5.0, *, at: float | None = None
) -> list[dict[str, Any]]:
    """Return the result vector of ``expr`` (at Unix time ``at``, default now)."""
    params: dict[str, Any] = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    return list(api(url, "/api/v1/query", params, timeout=timeout)["result"])
