"""Print each alert Alertmanager delivers: ``ddp-exporter receiver``, and the demo's receiver.

A webhook receiver in the standard library only, so that it runs from a bare install (even one
without torch): the generated compose stack runs it when no receiver of one's own (Slack,
PagerDuty, e-mail, a webhook) is configured, so ``docker compose up`` shows alerts as they
arrive. Each firing alert is one line::

    ALERT DDPRankDown severity=critical rank=1  run=demo: A training rank is down while ...
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .reaper import raise_on_signals

__all__ = ["AlertReceiver", "add_parser", "alert_line", "parse_listen", "run"]

#: Where the generated Alertmanager configuration posts when no receiver is configured.
DEFAULT_LISTEN = "127.0.0.1:5001"


def alert_line(alert: dict[str, Any]) -> str:
    """Return one alert of a webhook notification as one line (firing: ALERT, else RESOLVED)."""
    lab = alert.get("labels", {})
    extra = " ".join(f"{k}={lab[k]}" for k in ("cause", "role", "pg", "variable") if k in lab)
    state = "ALERT" if alert.get("status", "firing") == "firing" else "RESOLVED"
    return (
        f"{state} {lab.get('alertname')} severity={lab.get('severity')} "
        f"rank={lab.get('rank', '-')} {extra} run={lab.get('run')}: "
        f"{alert.get('annotations', {}).get('summary', '')}"
    )


class AlertReceiver:
    """Serve Alertmanager's webhook on ``host:port``; keep every firing alert, call ``on_alert``.

    ``on_alert`` gets each alert of each notification, firing or resolved (its ``status``).
    """

    def __init__(
        self,
        on_alert: Callable[[dict[str, Any]], None] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        #: Every firing alert so far, with its monotonic arrival time.
        self.alerts: list[tuple[float, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                try:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                except (TypeError, ValueError):
                    self.send_response(400)
                    self.end_headers()
                    return
                now = time.monotonic()
                for alert in body.get("alerts", []):
                    if alert.get("status") == "firing":
                        outer.alerts.append((now, alert))
                    if on_alert is not None:
                        on_alert(alert)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_port
        self.url = f"http://{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{self.port}/alerts"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving; idempotent."""
        self.server.shutdown()
        self.server.server_close()


def parse_listen(text: str) -> tuple[str, int]:
    """Return ``(host, port)`` of ``HOST:PORT`` (``:PORT`` listens on every interface)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``receiver`` to the ``ddp-exporter`` subcommands."""
    p = sub.add_parser(
        "receiver",
        help="print each alert Alertmanager delivers (a webhook receiver)",
        description="Serve Alertmanager's webhook and print each alert as one line: firing as "
        "ALERT, resolved as RESOLVED. Point a webhook_configs url at http://HOST:PORT/ (any "
        "path).",
    )
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help="HOST:PORT to serve (default %(default)s; :PORT: every interface)",
    )
    p.set_defaults(tool=run, parser=p)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``ddp-exporter receiver`` until interrupted."""
    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        args.parser.error(f"--listen: {exc}")

    def show(alert: dict[str, Any]) -> None:
        print(alert_line(alert), flush=True)

    try:
        receiver = AlertReceiver(show, host, port)
    except OSError as exc:
        print(f"ddp-exporter receiver: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 2
    print(f"ddp-exporter receiver: printing alerts posted to http://{args.listen}/", flush=True)
    raise_on_signals()  # docker stop sends SIGTERM to PID 1, which has no default action
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        return 130
    finally:
        receiver.close()
    return 0
