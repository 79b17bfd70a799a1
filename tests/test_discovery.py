"""Discovery: registration in a real c10d store, ``/sd`` over real HTTP, file_sd, addresses."""

from __future__ import annotations

import gzip
import json
import os
import socket
import urllib.error
import urllib.request

import pytest
import torch.distributed as dist

import exporter
from exporter import settings, storekeys
from exporter.errors import ErrorCounter
from exporter.export import discovery

pytestmark = pytest.mark.unit


class CountingStore:
    """A real HashStore that counts the calls made on it, by method."""

    def __init__(self) -> None:
        self.store = dist.HashStore()
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):
        method = getattr(self.store, name)

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return method(*args, **kwargs)

        return counted


def _labels(rank: int) -> dict[str, str]:
    return {"run": "r", "rank": str(rank), "local_rank": str(rank % 2), "node": f"n{rank // 2}"}


KEYS = storekeys.for_run("r")


def test_registration_is_one_store_write_and_the_list_grows_until_complete() -> None:
    store = CountingStore()
    errors = ErrorCounter()
    for rank in (0, 2):
        before = dict(store.calls)
        discovery.register(store, KEYS, f"10.0.0.{rank}:19400", _labels(rank))
        assert sum(store.calls.values()) - sum(before.values()) == 1
    directory = discovery.Directory(store, KEYS, world_size=4, errors=errors, interval_s=3600)
    directory.start()
    try:
        # Ranks 1 and 3 have not registered yet: the two that did are served already.
        groups = json.loads(directory.answer())
        assert [g["targets"] for g in groups] == [["10.0.0.0:19400"], ["10.0.0.2:19400"]]
        assert groups[1]["labels"] == _labels(2)
        assert not directory.complete
        discovery.register(store, KEYS, "10.0.0.1:19400", _labels(1))
        discovery.register(store, KEYS, "10.0.0.3:19400", _labels(3))
        store.store.append(KEYS.sd(), b"not json\n")
        discovery.register(store, KEYS, "10.0.0.1:19555", _labels(1))  # registered again
        reads = store.calls.get("get", 0)
        directory.refresh()
        assert store.calls["get"] == reads + 1  # one store read for the whole list
        groups = json.loads(directory.answer())
        assert [g["labels"]["rank"] for g in groups] == ["0", "1", "2", "3"]
        assert groups[1]["targets"] == ["10.0.0.1:19555"]
        assert directory.complete
        assert errors.snapshot()["discovery"] == 1  # the bad line, skipped
        assert json.loads(gzip.decompress(directory.answer(gzipped=True))) == groups
    finally:
        directory.close()


def test_advertised_address() -> None:
    assert discovery.advertise_host("0.0.0.0", {settings.ADVERTISE_ADDR: "node7.cluster"}) == (
        "node7.cluster"
    )
    assert discovery.advertise_host("10.1.2.3", {}) == "10.1.2.3"
    assert discovery.advertise_host("0.0.0.0", {settings.ADVERTISE_ADDR: "fd00::7"}) == "fd00::7"
    for bad in ("node7:19400", "http://node7"):  # not a host: logged, the address found
        assert discovery.advertise_host("10.1.2.3", {settings.ADVERTISE_ADDR: bad}) == "10.1.2.3"
    # Bound to every interface, the job on one node: never the loopback address.
    for bind in ("0.0.0.0", "::"):
        host = discovery.advertise_host(bind, {settings.MASTER_ADDR: "127.0.0.1"})
        assert not host.startswith("127.") and host != "::1"
        assert socket.getaddrinfo(host, 80)  # resolvable by whoever scrapes it
    assert discovery.format_target("::1", 19400) == "[::1]:19400"
    assert discovery.format_target("10.0.0.1", 19400) == "10.0.0.1:19400"


def test_default_run_label_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (settings.RUN, settings.TORCHELASTIC_RUN_ID, settings.SLURM_JOB_ID):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(settings.MASTER_ADDR, "n0")
    monkeypatch.setenv(settings.MASTER_PORT, "29500")
    assert settings.default_run() == "n0:29500"
    monkeypatch.setenv(settings.SLURM_JOB_ID, "4242")
    assert settings.default_run() == "4242"
    monkeypatch.setenv(settings.TORCHELASTIC_RUN_ID, "none")  # torchrun's placeholder
    assert settings.default_run() == "4242"
    monkeypatch.setenv(settings.TORCHELASTIC_RUN_ID, "rdzv-1")
    assert settings.default_run() == "rdzv-1"
    monkeypatch.setenv(settings.RUN, "mine")
    assert settings.default_run() == "mine"


def _get(url: str, gzipped: bool = False) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzipped else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_monitoring_rank_serves_sd_and_writes_file_sd(ddp, tmp_path, monkeypatch) -> None:
    model, loader, opt = ddp
    sd_dir = tmp_path / "file_sd"
    monkeypatch.setenv(settings.FILE_SD, str(sd_dir))
    obs = exporter.instrument(model, optimizer=opt, port=0, addr="127.0.0.1", run="sd/test:1")
    base = f"http://127.0.0.1:{obs.port}"
    expected = [
        {
            "targets": [f"127.0.0.1:{obs.port}"],
            "labels": {
                "run": "sd/test:1",
                "rank": "0",
                "local_rank": str(obs.local_rank),
                "node": socket.gethostname(),
            },
        }
    ]
    status, headers, body = _get(f"{base}/sd")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == expected
    status, headers, body = _get(f"{base}/sd", gzipped=True)
    assert headers.get("Content-Encoding") == "gzip"
    assert json.loads(gzip.decompress(body)) == expected
    # /metrics is still prometheus_client's handler.
    status, headers, body = _get(f"{base}/metrics")
    assert status == 200 and b"ddp_rank_info{" in body
    assert b'ddp_exporter_errors_total{rank="0",run="sd/test:1",where="discovery"} 0.0' in body
    # file_sd: one file for this rank, the same target group, no temporary file left.
    files = os.listdir(sd_dir)
    assert files == ["ddp-sd_test_1-rank-0.json"]
    assert json.loads((sd_dir / files[0]).read_text()) == expected
    obs.close()
    assert os.listdir(sd_dir) == []  # a clean exit removes it


def test_other_ranks_answer_404_on_sd(ddp, monkeypatch) -> None:
    model, loader, opt = ddp
    monkeypatch.delenv(settings.FILE_SD, raising=False)
    obs = exporter.instrument(model, port=0, addr="127.0.0.1", run="sd-none", monitor_rank=-1)
    status, _, body = _get(f"http://127.0.0.1:{obs.port}/sd")
    assert status == 404 and b"monitoring rank" in body
    assert obs.discovery is not None and obs.discovery.directory is None


def test_a_bad_advertise_address_is_logged_and_published_not_raised(ddp, monkeypatch, caplog):
    model, loader, opt = ddp
    monkeypatch.setenv(settings.ADVERTISE_ADDR, "node8:19401")
    with caplog.at_level("WARNING", logger="exporter"):
        obs = exporter.instrument(model, port=0, addr="127.0.0.1", run="sd-bad")
    said = [r.getMessage() for r in caplog.records if settings.ADVERTISE_ADDR in r.getMessage()]
    assert len(said) == 1 and "node8:19401" in said[0], said
    # Discovery goes on with the default address; the mistake is visible where people look.
    assert obs.discovery is not None and obs.errors.snapshot().get("discovery", 0) == 0
    status, _, body = _get(f"http://127.0.0.1:{obs.port}/metrics")
    assert status == 200
    assert f'variable="{settings.ADVERTISE_ADDR}"'.encode() in body
    status, _, body = _get(f"http://127.0.0.1:{obs.port}/sd")
    assert status == 200 and b"node8" not in body
