"""A real Prometheus scrapes a real job whose ranks serve over TLS with client certificates and
basic authentication, and finds them through ``/sd`` over the same.

Two ranks (one process each, as srun starts them) read ``DDP_EXPORTER_WEB_CONFIG`` and write
file_sd files. Prometheus runs the config ``mixin generate`` writes with TLS on (promtool checks
it first): the CA, its client certificate and its password (a file, never on a command line);
it scrapes every rank up over https (the ``__scheme__`` label the ranks publish). A second job
reads the monitoring rank's ``/sd`` over TLS and scrapes the same ranks without the password:
every scrape fails with 401. The job trains on throughout.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys

import pytest
import yaml
from harness import REPO, Process, Ranks, child_env, free_port, wait_for
from promstack import require, run_prometheus
from webpki import PASSWORD, USER, bcrypt_hash, client_file, make_pki, write_config

from exporter.deploy import stack
from exporter.mixin.config import DEFAULT
from exporter.tools.promapi import api, instant_query

pytestmark = pytest.mark.stack

pytest.importorskip("bcrypt")

WORLD = 2
WORKER = os.path.join(REPO, "tests", "workers", "unmodified_worker.py")


def _web_config(pki, folder) -> str:
    text = "\n".join(
        [
            "tls_server_config:",
            f"  cert_file: {pki.path('server.crt')}",
            f"  key_file: {pki.path('server.key')}",
            "  client_auth_type: RequireAndVerifyClientCert",
            f"  client_ca_file: {pki.path('ca.crt')}",
            "basic_auth_users:",
            f"  {USER}: {bcrypt_hash()}",
            "",
        ]
    )
    return str(write_config(folder / "web.yml", text))


def _generated(pki, tmp_path, password_file) -> dict:
    """The Prometheus config ``mixin generate`` writes with TLS on, checked by promtool."""
    cfg = dataclasses.replace(
        DEFAULT,
        scrape_scheme="https",
        scrape_ca_file=pki.path("ca.crt"),
        scrape_cert_file=pki.path("client.crt"),
        scrape_key_file=pki.path("client.key"),
        scrape_username=USER,
        scrape_password_file=str(password_file),
    )
    config = stack.prometheus_config(
        cfg,
        rule_files=[],
        file_sd_files=[str(tmp_path / "file_sd" / "*.json")],
        alertmanagers=(),
        scrape_interval="1s",
        evaluation_interval="1s",
    )
    path = tmp_path / "generated.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    check = subprocess.run(
        [require("promtool"), "check", "config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    return config


def test_prometheus_scrapes_and_discovers_tls_ranks_only_with_its_credentials(tmp_path):
    require("prometheus")
    pki = make_pki(tmp_path / "pki")
    password_file = write_config(tmp_path / "password", PASSWORD)
    config = _generated(pki, tmp_path, password_file)
    env = {
        "OMP_NUM_THREADS": "1",
        "DDP_EXPORTER_WEB_CONFIG": _web_config(pki, tmp_path),
        "DDP_EXPORTER_FILE_SD": str(tmp_path / "file_sd"),
    }
    cmd = ["-m", "exporter.tools.trainer", "--duration", "0", "--port", "0", "--run", "tls"]
    cmd += ["--addr", "127.0.0.1", "--heartbeat", "1", "--step-time", "0.1"]
    with Ranks(WORLD, cmd, env=env) as ranks:
        wait_for(lambda: len(ranks.urls) == WORLD, 180, "every rank to announce its URL")
        urls = ranks.urls
        assert all(url.startswith("https://127.0.0.1:") for url in urls.values()), urls
        (job,) = config["scrape_configs"]
        # The same CA and client certificate, no password: /sd (over TLS, with the password)
        # hands out the targets, every scrape of them is refused.
        sd = {"url": urls[0].replace("/metrics", "/sd"), "refresh_interval": "1s"}
        config["scrape_configs"].append(
            {
                "job_name": "no-password",
                "honor_labels": True,
                "http_sd_configs": [
                    {**sd, "tls_config": job["tls_config"], "basic_auth": job["basic_auth"]}
                ],
                "tls_config": job["tls_config"],
            }
        )
        with run_prometheus(tmp_path / "prom", config) as prom:
            wait_for(
                lambda: len(prom.query('up{job="ddp", run="tls"} == 1')) == WORLD,
                120,
                "Prometheus to scrape every rank over TLS",
            )
            active = prom.api("targets", state="active")["activeTargets"]
            scraped = {t["scrapeUrl"] for t in active if t["labels"]["job"] == "ddp"}
            assert scraped == set(urls.values()), active
            wait_for(
                lambda: prom.query('ddp_steps_total{job="ddp", run="tls"} > 0'),
                60,
                "training steps read over TLS",
            )

            def refused() -> list[str]:
                active = prom.api("targets", state="active")["activeTargets"]
                return [t["lastError"] for t in active if t["labels"]["job"] == "no-password"]

            wait_for(
                lambda: len(refused()) == WORLD and all("401" in e for e in refused()),
                60,
                "every scrape without the password refused with 401",
            )
            assert not prom.query('up{job="no-password"} == 1')
        assert all(p.poll() is None for p in ranks.procs.values()), ranks.output()[-3000:]


def test_run_watches_ranks_served_over_tls_with_its_client_file(tmp_path):
    """``ddp-exporter run --http-config``: its own Prometheus and table read the TLS ranks."""
    require("prometheus")
    pki = make_pki(tmp_path / "pki")
    client = client_file(pki, tmp_path)
    env = child_env(
        {
            "OMP_NUM_THREADS": "1",
            "TMPDIR": str(tmp_path),
            "DDP_EXPORTER_WEB_CONFIG": _web_config(pki, tmp_path),
        }
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    cmd = [sys.executable, "-m", "exporter.tools.cli", "run", "--stack", "--fast", "--top", "2"]
    # On loopback, the address the server's certificate names.
    cmd += ["--addr", "127.0.0.1", "--http-config", str(client)]
    cmd += ["--", *torchrun, WORKER, "--steps", "0"]
    with Process(cmd, env) as job:
        found = wait_for(
            lambda: re.search(r"Prometheus (http://127\.0\.0\.1:\d+)", job.text()) or job.poll(),
            120,
            "run's Prometheus",
        )
        assert job.poll() is None, job.output()
        url = found.group(1)

        def errors() -> list[str]:
            active = api(url, "/api/v1/targets", {"state": "active"})["activeTargets"]
            return [f"{t['scrapeUrl']}: {t['lastError']}" for t in active]

        try:
            wait_for(
                lambda: len(instant_query(url, 'up{job="ddp"} == 1')) == 2,
                120,
                "run's Prometheus to scrape both ranks over TLS",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {errors()}") from None
        wait_for(
            lambda: {"0", "1"} <= set(re.findall(r"^ +(\d) ", job.text(), re.M)),
            60,
            "the table to show both ranks",
        )
        assert "DOWN" not in job.text(), job.output()
        job.send_signal(signal.SIGTERM)
        assert job.wait(60) == 128 + signal.SIGTERM, job.output()
