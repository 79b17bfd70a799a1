"""Bad input to the ddp-exporter tools: a usage error exits 2 in one line naming the option or
file and what it expects, a failed read exits 1 in one line; never a traceback, never nonsense
accepted silently."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from harness import REPO, child_env

from exporter.tools import cli
from exporter.tools.top.fetch import fetch, target_url


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``ddp-exporter ARGV`` in this process; return its error line (it must exit 2)."""
    with pytest.raises(SystemExit) as ended:
        cli.main(list(argv))
    err = capsys.readouterr().err
    assert ended.value.code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"ddp-exporter {argv[0]}"), err
    assert "Traceback" not in err
    return line


def ddp_exporter(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``ddp-exporter ARGV`` in a process of its own (a tool that may start others)."""
    return subprocess.run(
        [sys.executable, "-m", "exporter.tools.cli", *argv],
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


@contextmanager
def refusing_port() -> Iterator[int]:
    """Yield a port bound but not listening: every connection to it is refused meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@contextmanager
def serving(body: bytes) -> Iterator[int]:
    """Yield the port of an HTTP server that answers every GET with ``body``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


# -- top ---------------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize(
    ("target", "url"),
    [
        ("10.0.0.1:9400", "http://10.0.0.1:9400/metrics"),
        ("[::1]:9400", "http://[::1]:9400/metrics"),
        ("http://node-1:9400/metrics", "http://node-1:9400/metrics"),
        ("https://node-1/x", "https://node-1/x"),
    ],
)
def test_a_target_is_host_port_or_an_http_url(target: str, url: str) -> None:
    assert target_url(target) == url


@pytest.mark.unit
@pytest.mark.parametrize(
    "target",
    ["garbage", "node:0", "node:", "node:99999", ":9400", "node:9400/x", "http://[::1", "ftp://x"],
)
def test_top_refuses_a_target_it_could_never_read(capsys, target: str) -> None:
    line = usage_error(capsys, "top", "--targets", f"127.0.0.1:9400,{target}", "--once")
    assert line.endswith(
        f"--targets: expected host:port (a port 1..65535) or an http(s) URL, got {target!r}"
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--refresh", "nan", "a number of seconds > 0 and <= 86400"),
        ("--refresh", "inf", "a number of seconds > 0 and <= 86400"),
        ("--refresh", "1e300", "a number of seconds > 0 and <= 86400"),
        ("--refresh", "0", "a number of seconds > 0 and <= 86400"),
        ("--worst", "0", "a whole number >= 1"),
        ("--worst", "-3", "a whole number >= 1"),
        ("--prometheus", "garbage", "an http:// or https:// URL"),
        ("--prometheus", "http://[::1", "an http:// or https:// URL"),
        ("--window", "0s", "a duration > 0"),
    ],
)
def test_top_refuses_an_option_value_out_of_its_range(capsys, option, value, expected) -> None:
    source = ["--targets", "127.0.0.1:9400"]
    if option in ("--prometheus", "--window"):
        source = ["--prometheus", "http://127.0.0.1:9", "--run", "x"]
    line = usage_error(capsys, "top", *source, option, value, "--once")
    assert f"argument {option}: expected {expected}" in line and repr(value) in line


@pytest.mark.unit
def test_top_once_exits_1_in_one_line_when_no_rank_can_be_read(capsys) -> None:
    with refusing_port() as port:
        code = cli.main(["top", "--targets", f"127.0.0.1:{port}", "--once", "--refresh", "0.01"])
    out, err = capsys.readouterr()
    assert code == 1 and out == "", out
    assert err.count("\n") == 1, err
    assert err.startswith(f"ddp-exporter top: no rank could be read: 127.0.0.1:{port} ("), err


@pytest.mark.unit
def test_a_rank_read_while_another_is_not_is_down_in_the_table(capsys) -> None:
    page = b'# TYPE ddp_steps_total counter\nddp_steps_total{rank="0"} 5\n'
    with serving(page) as up, refusing_port() as down:
        targets = f"127.0.0.1:{up},127.0.0.1:{down}"
        code = cli.main(["top", "--targets", targets, "--once", "--refresh", "0.01"])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    assert "DOWN: endpoint unreachable" in out


@pytest.mark.unit
def test_an_endpoint_that_is_no_rank_s_page_is_down_with_why() -> None:
    with serving(b"<html><body>a web page</body></html>\n") as page:
        with socket.socket() as ssh:  # a server that does not speak HTTP at all
            ssh.bind(("127.0.0.1", 0))
            ssh.listen()

            def greet() -> None:
                conn, _ = ssh.accept()
                with conn:
                    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                    conn.recv(1024)

            threading.Thread(target=greet, daemon=True).start()
            rows = fetch([f"127.0.0.1:{page}", f"127.0.0.1:{ssh.getsockname()[1]}"])
    assert [r.up for r in rows] == [False, False]
    assert rows[0].error.startswith("not a metrics page"), rows[0].error
    assert rows[1].error, rows[1]


# -- goodput and nodes -------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--window", "bogus", "a duration > 0"),
        ("--window", "0s", "a duration > 0"),
        ("--lookback", "forever", "a duration > 0"),
        ("--max-drop", "nan", "a number from 0 to 1"),
        ("--max-drop", "-0.1", "a number from 0 to 1"),
        ("--max-drop", "2", "a number from 0 to 1"),
        ("--prometheus", "localhost:9090", "an http:// or https:// URL"),
    ],
)
def test_goodput_refuses_a_bad_value_before_it_reads_anything(
    capsys, option, value, expected
) -> None:
    with refusing_port() as port:  # nothing answers there: a read would exit 1, not 2
        prometheus = ["--prometheus", f"http://127.0.0.1:{port}", "--run", "r"]
        line = usage_error(capsys, "goodput", *prometheus, option, value)
    assert f"argument {option}: expected {expected}" in line and repr(value) in line


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"ddp_exporter_goodput": 1}', "no field 'totals'"),
        ('{"ddp_exporter_goodput": 1, "totals": [1]}', "'list' object has no attribute 'get'"),
    ],
)
def test_goodput_names_a_file_that_holds_no_account_it_can_read(capsys, tmp_path, text, why):
    path = tmp_path / "r-goodput.json"
    path.write_text(text)
    for argv in (["--file", str(path)], ["--compare", str(path), str(path)]):
        assert cli.main(["goodput", *argv]) == 1
        out, err = capsys.readouterr()
        assert out == "", out
        assert err == f"ddp-exporter goodput: {path} holds no readable goodput account: {why}\n"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--worst", "0", "a whole number >= 1"),
        ("--prometheus", "garbage", "an http:// or https:// URL"),
    ],
)
def test_nodes_refuses_a_bad_value_before_it_reads_anything(capsys, option, value, expected):
    with refusing_port() as port:
        argv = ["nodes", "--prometheus", f"http://127.0.0.1:{port}", option, value]
        line = usage_error(capsys, *argv)
    assert f"argument {option}: expected {expected}" in line and repr(value) in line


# -- doctor ------------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--timeout", "inf", "a number of seconds > 0 and <= 86400"),
        ("--timeout", "nan", "a number of seconds > 0 and <= 86400"),
        ("--timeout", "0", "a number of seconds > 0 and <= 86400"),
        ("--step-timeout", "inf", "a number of seconds > 0 and <= 86400"),
        ("--step-timeout", "-1", "a number of seconds > 0 and <= 86400"),
        ("--links-mib", "nan", "a size in MiB > 0 and <= 1024"),
        ("--links-mib", "1e300", "a size in MiB > 0 and <= 1024"),
    ],
)
def test_doctor_refuses_a_value_out_of_range_before_any_rank_runs(
    capsys, option, value, expected
) -> None:
    from exporter.tools import doctor

    line = usage_error(capsys, "doctor", option, value)
    assert line.endswith(f"argument {option}: expected {expected}, got {value!r}"), line
    # python -m exporter.doctor: the same parser, the same refusal.
    with pytest.raises(SystemExit) as ended:
        doctor.main([option, value], environ={})
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(repr(value))


# -- demo --------------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--port", "70000", "a port 0..65535"),
        ("--port", "-5", "a port 0..65535"),
        ("--duration", "-1", "a number of seconds >= 0 and <= 86400"),
        ("--duration", "inf", "a number of seconds >= 0 and <= 86400"),
        ("--fault-after", "-1", "a number of seconds >= 0 and <= 86400"),
        ("--fault-after", "nan", "a number of seconds >= 0 and <= 86400"),
        ("--refresh", "0", "a number of seconds > 0 and <= 86400"),
        ("--ranks", "0", "a whole number >= 1"),
    ],
)
def test_demo_refuses_a_value_out_of_range_before_it_starts_anything(
    capsys, option, value, expected
) -> None:
    line = usage_error(capsys, "demo", "--no-stack", option, value)
    assert line.endswith(f"argument {option}: expected {expected}, got {value!r}"), line


@pytest.mark.unit
def test_demo_refuses_ports_past_65535_and_a_file_sd_that_is_no_folder(capsys, tmp_path) -> None:
    line = usage_error(capsys, "demo", "--no-stack", "--port", "65535", "--ranks", "2")
    assert line.endswith("--port 65535: its ranks would serve on 65535..65536, past 65535")
    afile = tmp_path / "targets.json"
    afile.write_text("[]")
    line = usage_error(capsys, "demo", "--no-stack", "--port", "0", "--file-sd", str(afile))
    assert line.endswith(f"--file-sd: expected a folder, {afile} is a file"), line
    under = afile / "sd"
    line = usage_error(capsys, "demo", "--no-stack", "--port", "0", "--file-sd", str(under))
    assert line.endswith(f"--file-sd: cannot create the folder {under}: Not a directory"), line


# -- run ---------------------------------------------------------------------------------------
@pytest.mark.tool
def test_run_refuses_a_table_interval_it_could_not_wait_and_a_file_sd_that_is_no_folder(
    tmp_path,
) -> None:
    for value in ("1e300", "nan", "-1"):
        out = ddp_exporter("run", "--no-stack", "--top", value, "--", "true")
        assert out.returncode == 2 and out.stdout == "", out
        line = out.stderr.strip().splitlines()[-1]
        expected = "argument --top: expected a number of seconds >= 0 and <= 86400"
        assert line == f"ddp-exporter run: error: {expected}, got {value!r}", out.stderr
    afile = tmp_path / "targets"
    afile.write_text("")
    for folder, why in ((afile, "expected a folder, {} is a file"), (afile / "x", None)):
        out = ddp_exporter(
            "run",
            "--no-stack",
            "--top",
            "1",
            "--",
            "true",
            env={"DDP_EXPORTER_FILE_SD": str(folder)},
        )
        assert out.returncode == 2 and out.stdout == "", out
        said = why.format(folder) if why else f"cannot create the folder {folder}: Not a directory"
        assert out.stderr == f"ddp-exporter run: DDP_EXPORTER_FILE_SD: {said}\n", out.stderr


# -- mixin -------------------------------------------------------------------------------------
@pytest.mark.unit
def test_mixin_refuses_an_out_or_root_that_is_no_folder(capsys, tmp_path) -> None:
    afile = tmp_path / "rules.yml"
    afile.write_text("")
    line = usage_error(capsys, "mixin", "generate", "--out", str(afile))
    assert line.endswith(f"--out: expected a folder, {afile} is a file"), line
    line = usage_error(capsys, "mixin", "generate", "--out", str(afile / "out"))
    assert f"--out: cannot write {afile / 'out'}" in line and line.endswith(": Not a directory")
    for root in (tmp_path / "nothing", afile):
        line = usage_error(capsys, "mixin", "check", "--root", str(root))
        assert line.endswith(
            f"--root: expected the folder of the generated files, {root} is not one"
        )


@pytest.mark.unit
@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("base_port=abc", "--set base_port: expected a whole number, got 'abc'"),
        ("straggler_ratio=x", "--set straggler_ratio: expected a number, got 'x'"),
        ("straggler_ratio=nan", "straggler_ratio must be in [1, inf): nan"),
        ("straggler_ratio=-1", "straggler_ratio must be in [1, inf): -1.0"),
        ("dashboard_refresh=xyz", "dashboard_refresh must be a duration of one unit"),
        ("selector=}{", "selector: expected label matchers"),
    ],
)
def test_mixin_set_and_config_files_name_the_field_they_refuse(capsys, tmp_path, setting, said):
    out = tmp_path / "out"
    line = usage_error(capsys, "mixin", "generate", "--out", str(out), "--set", setting)
    assert said in line, line
    assert not out.exists()  # refused before a file is written
    if "nan" in setting:  # a config file gets the same checks (JSON as Python reads it: NaN)
        config = tmp_path / "mixin.json"
        config.write_text('{"ddp_exporter_mixin": {"straggler_ratio": NaN}}')
        line = usage_error(capsys, "mixin", "generate", "--out", str(out), "--config", str(config))
        assert said in line, line
