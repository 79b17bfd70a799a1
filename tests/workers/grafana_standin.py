"""Stand in for Grafana, which cannot be installed here: read what ``run`` provisioned, say it.

Started as Grafana is (``server --homepath HOME --config INI``) through the binary variable
``DDP_EXPORTER_GRAFANA_BINARY``. It reads the configuration file as Grafana would (the server's
address, the provisioning folder), follows the provisioned Prometheus datasource to the live
server and the dashboard provider to its JSON files, writes what it found as JSON to
``GRAFANA_STANDIN_REPORT``, and answers ``/api/health`` until SIGTERM.
"""

from __future__ import annotations

import configparser
import json
import os
import signal
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml


def _read(args: list[str]) -> tuple[configparser.ConfigParser, dict]:
    assert args[0] == "server" and "--homepath" in args, args
    ini = configparser.ConfigParser()
    ini.read(args[args.index("--config") + 1])
    provisioning = Path(ini["paths"]["provisioning"])
    sources = yaml.safe_load((provisioning / "datasources" / "ddp.yml").read_text())
    (prometheus,) = [d for d in sources["datasources"] if d["type"] == "prometheus"]
    with urllib.request.urlopen(f"{prometheus['url']}/-/ready", timeout=5) as resp:
        ready = resp.status
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "ddp.yml").read_text())["providers"]
    folder = Path(provider["options"]["path"])
    uids = sorted(json.loads(p.read_text())["uid"] for p in folder.glob("*.json"))
    report = {
        "pid": os.getpid(),
        "addr": ini["server"]["http_addr"],
        "datasource_uid": prometheus["uid"],
        "prometheus_ready": ready,
        "dashboards": uids,
        "anonymous": ini["auth.anonymous"]["enabled"],
    }
    return ini, report


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        code = 200 if self.path == "/api/health" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b'{"database": "ok"}' if code == 200 else b"")

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    ini, report = _read(sys.argv[1:])
    Path(os.environ["GRAFANA_STANDIN_REPORT"]).write_text(json.dumps(report))
    server = ThreadingHTTPServer(
        (ini["server"]["http_addr"], int(ini["server"]["http_port"])), _Health
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.serve_forever()


if __name__ == "__main__":
    main()
