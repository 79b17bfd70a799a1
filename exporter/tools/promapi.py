"""Ask Prometheus's HTTP API one instant query (the offline tools' one client)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

__all__ = ["instant_query"]


def instant_query(url: str, expr: str, timeout: float = 5.0) -> list[dict]:
    """Return the result vector of ``expr`` at Prometheus ``url``; raise RuntimeError on failure."""
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{q}", timeout=timeout) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus query failed: {body.get('error', body)}")
    return body["data"]["result"]
