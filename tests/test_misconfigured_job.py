"""A typo in the exporter's variables never costs a run: a real 2-rank torchrun job proves it.

One job of ``examples/train_ddp.py`` with every ``DDP_EXPORTER_*`` variable that can hold a bad
value set to one at once (the per-variable behaviour of the validator is unit-tested in
``test_settings_validator.py``): training reaches its end and exits 0, each process logs exactly
one line per variable naming it, and a real Prometheus evaluating the FAST rules fires
``DDPExporterMisconfigured`` for each of them.

``DDP_EXPORTER_PORT=notaport`` makes the ranks serve on the default ports 19400 and 19401, as a
user's job would: the test waits for them to be free first.
"""

from __future__ import annotations

import socket

import pytest
from harness import REPO, Job, wait_for
from promstack import fast_config, run_prometheus, static_scrape

# A bad DDP_EXPORTER_PORT means the default ports: one test at a time may hold them.
pytestmark = [pytest.mark.stack, pytest.mark.xdist_group("default-ports")]

#: What a user might mistype, for every variable the training process reads.
BAD = {
    "DDP_EXPORTER_PORT": "notaport",
    "DDP_EXPORTER_ON_HANG": "explode",
    "DDP_EXPORTER_COMM_TIMING": "sometimes",
    "DDP_EXPORTER_DUMP_DIR": "/proc/ddp-exporter-dumps",
    "DDP_EXPORTER_ADDR": "local host",
    "DDP_EXPORTER_HEARTBEAT_S": "soon",
    "DDP_EXPORTER_MONITOR_RANK": "-2",
    "DDP_EXPORTER_PEER_SERIES": "-5",
    "DDP_EXPORTER_FLIGHT_RECORDER": "maybe",
    "DDP_EXPORTER_ADVERTISE_ADDR": "http://node7:19400",
    "DDP_EXPORTER_JOB_DEADLINE": "two days",
    "DDP_EXPORTER_FINAL_SCRAPE_S": "-1",
    "DDP_EXPORTER_ABORT_AFTER_S": "0",
    "DDP_EXPORTER_ABORT_EXIT_CODE": "256",
    "DDP_EXPORTER_ABORT_LIMIT": "many",
    "DDP_EXPORTER_ABORT_PROGRESS_STEPS": "0",
    "DDP_EXPORTER_GIVE_UP_EXIT_CODE": "300",
    "DDP_EXPORTER_ATTEMPT": "-1",
    "DDP_EXPORTER_NODE": "gpu node 7; rm",
}
PORTS = (19400, 19401)


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_every_bad_variable_is_one_line_per_process_and_an_alert(tmp_path):
    wait_for(lambda: all(map(_free, PORTS)), 120, f"ports {PORTS} to be free")
    env = dict(BAD, OMP_NUM_THREADS="1", DDP_EXPORTER_RUN="misconfigured")
    args = ["--epochs", "80", "--samples", "4096", "--checkpoint", str(tmp_path / "ck.pt")]
    # Prometheus first: the ranks serve on the default ports, scraped from their first second.
    scrape = static_scrape({r: f"http://127.0.0.1:{p}/metrics" for r, p in enumerate(PORTS)})
    with run_prometheus(tmp_path / "prom", fast_config(tmp_path / "prom", scrape)) as prom:
        # --tee 3 prefixes each line with its process ([default0]:, [default1]:).
        with Job(
            2,
            args,
            env=env,
            module=f"{REPO}/examples/train_ddp.py",
            torchrun=["--tee", "3", "--log-dir", str(tmp_path / "logs")],
        ) as job:
            urls = job.wait_urls()
            ports = sorted(int(u.rsplit(":", 1)[1].split("/")[0]) for u in urls.values())
            assert ports == list(PORTS), urls
            code = job.wait(timeout=300)
            text = job.text()
        # Over the whole run: which variables fired, and on how many ranks each was reported.
        fired = prom.query(
            'count by (variable) (max_over_time(ALERTS{alertname="DDPExporterMisconfigured", '
            'alertstate="firing", run="misconfigured"}[10m]))'
        )
        ranks = prom.query(
            "count by (variable) (max_over_time(ddp_exporter_invalid_setting_info[10m]))"
        )
    assert code == 0, text[-3000:]
    assert "epoch 79: loss" in text, text[-3000:]
    assert {r["metric"]["variable"] for r in fired} == set(BAD), set(BAD) - {
        r["metric"]["variable"] for r in fired
    }
    assert {r["metric"]["variable"]: r["value"][1] for r in ranks} == dict.fromkeys(BAD, "2")
    for process in ("[default0]:", "[default1]:"):
        mine = [line for line in text.splitlines() if line.startswith(process)]
        for name, raw in BAD.items():
            lines = [line for line in mine if f"ddp-exporter: {name}: expected" in line]
            assert len(lines) == 1, (process, name, lines)
            assert repr(raw) in lines[0] and "training goes on" in lines[0], lines[0]
    assert "Traceback" not in text
