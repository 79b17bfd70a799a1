"""free_port: consecutive ports the caller can bind, out of the way of outgoing connections."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from exporter.tools import localstack
from exporter.tools.localstack import free_port

pytestmark = pytest.mark.unit


def _bind_all(base: int, count: int) -> None:
    socks = [socket.socket() for _ in range(count)]
    try:
        for i, s in enumerate(socks):
            s.bind(("127.0.0.1", base + i))
    finally:
        for s in socks:
            s.close()


def test_free_ports_are_bindable_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for count in (1, 3):
        base = free_port(count)
        _bind_all(base, count)
        if low >= 2048:  # room below the range: outgoing connections never take these
            assert 1024 <= base and base + count <= low, (base, low)


def test_a_port_is_not_handed_out_twice_in_a_row() -> None:
    bases = [free_port(2) for _ in range(50)]
    ports = [b + i for b in bases for i in range(2)]
    assert len(set(ports)) == len(ports), sorted(ports)


def test_a_range_that_leaves_no_room_falls_back_to_the_kernel_s_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wide = tmp_path / "ip_local_port_range"
    wide.write_text("1024\t65535\n")
    monkeypatch.setattr(localstack, "_EPHEMERAL", wide)
    base = free_port(2)
    _bind_all(base, 2)
    monkeypatch.setattr(localstack, "_EPHEMERAL", tmp_path / "missing")
    _bind_all(free_port(), 1)


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def _nothing_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *variables: str) -> None:
    """An empty PATH, a fresh home folder and none of ``variables`` set."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in variables:
        monkeypatch.delenv(name, raising=False)


def test_the_binaries_are_found_by_their_variable_on_path_or_where_a_release_is_unpacked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variables = ("DDP_EXPORTER_PROMETHEUS_BINARY", "DDP_EXPORTER_ALERTMANAGER_BINARY")
    _nothing_installed(tmp_path, monkeypatch, *variables)
    if Path("/usr/local/bin/prometheus").exists() or Path("/opt/prometheus").exists():
        pytest.skip("a release is installed in a searched place on this machine")
    with pytest.raises(localstack.MissingBinaryError) as missing:
        localstack.find_binaries()
    assert "prometheus and alertmanager not found on PATH" in str(missing.value)
    assert "DDP_EXPORTER_PROMETHEUS_BINARY" in str(missing.value)
    # Official releases unpacked in the home folder: the newest of each.
    home = tmp_path / "home"
    _executable(home / "prometheus-2.53.0.linux-amd64" / "prometheus")
    newest = _executable(home / "prometheus-3.1.0.linux-amd64" / "prometheus")
    manager = _executable(home / "alertmanager-0.28.0.linux-amd64" / "alertmanager")
    assert localstack.find_binaries() == (str(newest), str(manager))
    # A variable names it anywhere, and wins; one that names no executable says so.
    elsewhere = _executable(tmp_path / "tools" / "prom")
    monkeypatch.setenv("DDP_EXPORTER_PROMETHEUS_BINARY", str(elsewhere))
    assert localstack.find_binary("prometheus") == str(elsewhere)
    monkeypatch.setenv("DDP_EXPORTER_PROMETHEUS_BINARY", str(tmp_path / "nothing"))
    with pytest.raises(localstack.MissingBinaryError) as wrong:
        localstack.find_binaries()
    assert str(wrong.value) == (
        f"DDP_EXPORTER_PROMETHEUS_BINARY={tmp_path / 'nothing'} is not an executable file"
    )


def test_grafana_is_found_and_run_from_its_home_with_a_configuration_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exporter.mixin.config import DEFAULT
    from exporter.tools import localgrafana

    _nothing_installed(tmp_path, monkeypatch, "DDP_EXPORTER_GRAFANA_BINARY")
    if any(Path(p).exists() for p in ("/usr/sbin/grafana-server", "/usr/share/grafana")):
        pytest.skip("Grafana is installed on this machine")
    assert localgrafana.find_grafana() is None
    # An official release unpacked in the home folder: bin/grafana, its home one level up.
    home = tmp_path / "home" / "grafana-12.1.0"
    binary = _executable(home / "bin" / "grafana")
    (home / "conf").mkdir()
    (home / "conf" / "defaults.ini").write_text("")
    assert localgrafana.find_grafana() == str(binary)
    ini = localgrafana.write_grafana_files(
        tmp_path / "run", 3000, "http://127.0.0.1:9090", "http://127.0.0.1:9093", DEFAULT
    )
    command = [str(binary), "server", "--homepath", str(home), "--config", str(ini)]
    assert localgrafana.grafana_command(str(binary), ini) == command
    text = ini.read_text()
    assert "http_addr = 127.0.0.1" in text and "http_port = 3000" in text
    assert (tmp_path / "run" / "dashboards" / "overview.json").is_file()
    # Debian's grafana-server takes the flags without the subcommand; the variable wins.
    old = _executable(tmp_path / "sbin" / "grafana-server")
    monkeypatch.setenv("DDP_EXPORTER_GRAFANA_BINARY", str(old))
    assert localgrafana.find_grafana() == str(old)
    assert localgrafana.grafana_command(str(old), ini)[1] == "--homepath"
