"""Render the Grafana dashboards as PNGs from a real Prometheus filled by a drill.

    python3 scripts/render_dashboards.py --out docs/img

Grafana cannot run everywhere the docs are built, so this draws each dashboard the way
Grafana lays it out, from the same PromQL its panels send. The drill: three ranks of the demo
trainer (``exporter.tools.trainer``, a DDP job on gloo), one process per rank and each with its
own ``node`` label, scraped every second by Prometheus with the FAST rules and Alertmanager
(``exporter.tools.localstack``; Debian's ``prometheus`` and ``prometheus-alertmanager``). Rank 2
straggles (+150 ms compute per step) from ``--straggle-at`` seconds, its stand-in GPU throttled
from then on (each rank serves a real H200's recorded GPU health, tests/recordings), then stops
entering collectives (a hang) at ``--hang-at``; the drill ends ``--tail`` seconds later, about
three minutes in all. Then every panel of the generated dashboards is queried over the drill with
the PromQL its JSON holds (``$run`` = the drill's run, the other variables All,
``$__rate_interval`` = 10s) and drawn with matplotlib on the dashboard's own grid. The JSON is
the FAST variant's (``ddp-exporter mixin generate --fast``): the same panels and queries as
``dashboards/grafana/*.json``, over the recorded series of the FAST rules the drill's
Prometheus evaluates. ``--save FILE`` keeps the query results and
``--load FILE`` draws from them without a drill.

Every process the drill starts is stopped when it ends, on Ctrl-C, SIGTERM and SIGHUP.
Needs the ``docs`` extra (matplotlib) and the ``mixin`` extra (PyYAML).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from exporter.mixin.config import FAST
from exporter.mixin.dashboards import render_dashboards
from exporter.tools.localstack import LocalStack, free_port
from exporter.tools.promapi import api
from exporter.tools.reaper import Interrupted, become_subreaper, raise_on_signals, stop_tree

REPO = Path(__file__).resolve().parents[1]
#: The dashboards in the order the docs show them.
DASHBOARDS = ("overview", "stragglers", "collectives", "liveness", "memory", "goodput", "fleet")
#: Dashboards drawn as they look just before the hang (the straggler at its height); the
#: others as they look at the end of the drill, the hang going on.
BEFORE_HANG = ("overview", "stragglers", "memory")
RANKS = 3
RUN = "drill"
STEP_S = 2
RATE_INTERVAL = "10s"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="folder of the PNGs")
    p.add_argument("--straggle-at", type=float, default=30.0, help="seconds into training")
    p.add_argument("--hang-at", type=float, default=110.0, help="seconds into training")
    p.add_argument("--tail", type=float, default=45.0, help="seconds the hang lasts")
    p.add_argument("--save", type=Path, help="also write the query results to this JSON file")
    p.add_argument("--load", type=Path, help="draw from query results saved by --save")
    return p.parse_args(argv)


# -- the drill ----------------------------------------------------------------------------------
def _start_ranks(workdir: Path, file_sd: Path, args: argparse.Namespace) -> list[subprocess.Popen]:
    master_port = str(free_port())
    procs = []
    for rank in range(RANKS):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK="0",
            WORLD_SIZE=str(RANKS),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=master_port,
            DDP_EXPORTER_NODE=f"node-{rank}",
            DDP_EXPORTER_DUMP_DIR=str(workdir / "dumps"),
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        cmd = [
            sys.executable,
            "-m",
            "exporter.tools.trainer",
            "--duration",
            "0",
            "--fault",
            "straggler",
            "--fault-rank",
            "2",
            "--fault-after",
            str(args.straggle_at),
            "--hang-after",
            str(args.hang_at),
            "--straggle",
            "0.15",
            "--run",
            RUN,
            "--addr",
            "127.0.0.1",
            "--port",
            "0",
            "--heartbeat",
            "1",
            "--file-sd",
            str(file_sd),
            "--timeout",
            "900",
            "--gpu-recording",
            str(REPO / "tests" / "recordings" / "gpu-h200.json"),
            "--gpu-fault",
            "throttle",
        ]
        log = open(workdir / f"rank-{rank}.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
        log.close()
    return procs


def _wait_for_steps(stack: LocalStack, procs: list[subprocess.Popen], timeout: float) -> float:
    """Return the time (Unix) Prometheus first saw every rank step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a rank exited before training; see its log in the work folder")
        if len(stack.query(f'ddp_steps_total{{run="{RUN}"}} > 0')) == RANKS:
            return time.time()
        time.sleep(1)
    raise RuntimeError(f"the ranks did not start training within {timeout:g} s")


def drill(args: argparse.Namespace) -> dict[str, Any]:
    """Run the drill; return every panel's query results over it."""
    raise_on_signals()  # SIGTERM and SIGHUP stop everything like Ctrl-C
    become_subreaper()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="ddpx-render-") as tmp:
        workdir = Path(tmp)
        file_sd = workdir / "file_sd"
        file_sd.mkdir()
        try:
            with LocalStack(workdir / "stack", file_sd) as stack:
                t0 = time.time()
                procs = _start_ranks(workdir, file_sd, args)
                started = _wait_for_steps(stack, procs, timeout=120)
                print(
                    f"render: training since {started - t0:.0f} s; drill runs "
                    f"{args.hang_at + args.tail:.0f} s",
                    flush=True,
                )
                time.sleep(max(0.0, started + args.hang_at + args.tail - time.time()))
                alerts = sorted({a["labels"]["alertname"] for _, a in stack.alerts})
                print(f"render: alerts delivered: {', '.join(alerts) or 'none'}", flush=True)
                data = query_all(
                    stack.prometheus_url, started - 5, started + args.hang_at - 2, time.time()
                )
                data["events"] = [
                    [started + args.straggle_at, "rank 2 straggles"],
                    [started + args.hang_at, "rank 2 hangs"],
                ]
                data["started"] = started
                return data
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
            for proc in procs:
                stop_tree(proc, grace=5)


# -- queries ------------------------------------------------------------------------------------
def substitute(expr: str) -> str:
    """Return ``expr`` with the dashboard variables set as the pictures show them."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$run", RUN)
    return re.sub(r"\$\{?(cluster|node|rank)\}?", ".*", expr)


def _get(url: str, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        return list(api(url, path, params, timeout=30)["result"])
    except RuntimeError as exc:
        raise RuntimeError(f"{params['query']!r}: {exc}") from None


def boards() -> dict[str, dict[str, Any]]:
    """Return the FAST variant of each dashboard's JSON, by file stem."""
    return {
        name.removesuffix(".json"): json.loads(text)
        for name, text in render_dashboards(FAST).items()
        if name.endswith(".json")
    }


def query_all(url: str, start: float, before_hang: float, end: float) -> dict[str, Any]:
    """Return ``{dashboard: {"start", "end", "panels": [[results per target], ...]}}``.

    A dashboard of :data:`BEFORE_HANG` is queried as Grafana would show it at ``before_hang``
    (its time range ends there), the others at ``end``.
    """
    out: dict[str, Any] = {}
    every = boards()
    for stem in DASHBOARDS:
        board = every[stem]
        until = before_hang if stem in BEFORE_HANG else end
        panels = []
        for panel in board["panels"]:
            results = []
            for target in panel.get("targets", []):
                expr = substitute(target["expr"])
                if target.get("instant"):
                    results.append(_get(url, "/api/v1/query", {"query": expr, "time": until}))
                else:
                    results.append(
                        _get(
                            url,
                            "/api/v1/query_range",
                            {"query": expr, "start": start, "end": until, "step": STEP_S},
                        )
                    )
            panels.append(results)
        out[stem] = {"start": start, "end": until, "panels": panels}
    return out


# -- drawing ------------------------------------------------------------------------------------
BG, PANEL, TEXT, DIM, GRID = "#111217", "#181b1f", "#ccccdc", "#8e8e9e", "#2c3235"
#: Grafana's named colours, as its dark theme draws them.
NAMED = {
    "green": "#73bf69",
    "yellow": "#fade2a",
    "orange": "#ff9830",
    "red": "#f2495c",
    "blue": "#5794f2",
    "text": "#ccccdc",
}
COLORS = ("#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0")


def _legend(fmt: str, labels: dict[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt or "")
    return text or ", ".join(f"{k}={v}" for k, v in labels.items() if k != "__name__") or "value"


def _fmt(value: float, unit: str) -> str:
    if value != value:  # NaN
        return "NaN"
    if unit == "s":
        if value and abs(value) < 0.001:
            return f"{value * 1e6:.0f} µs"
        return f"{value * 1000:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit == "hertz":
        return f"{value / 1e9:.2f} GHz" if abs(value) >= 1e9 else f"{value / 1e6:.0f} MHz"
    if unit in ("bytes", "Bps"):
        for size, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= size:
                return f"{value / size:.1f} {name}" + ("/s" if unit == "Bps" else "")
        return f"{value:.0f} B" + ("/s" if unit == "Bps" else "")
    if unit == "ops":
        return f"{value:.1f}/s"
    if unit == "dateTimeAsIso":
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(value))
    return f"{value:.3g}"


def _color(panel: dict, value: float) -> str:
    """Return the threshold colour of ``value`` (the last step at or below it)."""
    steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
    color = "green"
    for step in steps:
        if step.get("value") is None or value >= step["value"]:
            color = step["color"]
    return NAMED.get(color, color)


def _timeseries(ax: Any, panel: dict, results: list, data: dict, unit: str) -> bool:
    origin = data["started"]
    drawn = 0
    for target, series in zip(panel["targets"], results):
        for s in series:
            xs = [float(t) - origin for t, _ in s["values"]]
            ys = [float(v) for _, v in s["values"]]
            ax.plot(
                xs,
                ys,
                lw=1.3,
                color=COLORS[drawn % len(COLORS)],
                label=_legend(target.get("legendFormat", ""), s["metric"]),
            )
            drawn += 1
    if not drawn:
        return False
    ax.set_facecolor(PANEL)
    ax.tick_params(colors=DIM, labelsize=6)
    ax.grid(color=GRID, lw=0.5)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.yaxis.set_major_formatter(lambda v, _: _fmt(v, unit))
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0f} s")
    ax.set_xlim(data["start"] - origin, data["end"] - origin)
    for when, what in data["events"]:
        if when > data["end"]:
            continue
        ax.axvline(when - origin, color=DIM, lw=0.8, ls="--")
        ax.text(
            when - origin,
            1.0,
            f" {what}",
            transform=ax.get_xaxis_transform(),
            fontsize=5.5,
            color=DIM,
            va="top",
        )
    if drawn <= 12:
        ax.legend(
            fontsize=5.5,
            loc="upper left",
            bbox_to_anchor=(0, -0.1),
            frameon=False,
            labelcolor=TEXT,
            ncol=min(drawn, 4),
            handlelength=1.2,
        )
    return True


def _last(series: dict) -> float:
    if "value" in series:
        return float(series["value"][1])
    return float(series["values"][-1][1]) if series["values"] else float("nan")


def _values(panel: dict, results: list) -> list[tuple[str, float, dict]]:
    return [
        (_legend(t.get("legendFormat", ""), s["metric"]), _last(s), s["metric"])
        for t, series in zip(panel["targets"], results)
        for s in series
    ]


def _stat(ax: Any, panel: dict, results: list, unit: str) -> bool:
    values = _values(panel, results)
    if not values:
        no_value = panel["fieldConfig"]["defaults"].get("noValue")
        if no_value is None:
            return False
        values = [("", float(no_value), {})]
    ax.axis("off")
    for i, (label, value, _) in enumerate(values[:4]):
        y = 1 - (i + 0.6) / max(len(values[:4]), 1)
        ax.text(
            0.5,
            y,
            _fmt(value, unit),
            ha="center",
            va="center",
            fontsize=18,
            color=_color(panel, value),
            transform=ax.transAxes,
            weight="bold",
        )
        if len(values) > 1:
            ax.text(
                0.5, y - 0.22, label, ha="center", fontsize=6, color=DIM, transform=ax.transAxes
            )
    return True


def _bars(ax: Any, panel: dict, results: list, unit: str) -> bool:
    values = sorted(_values(panel, results), key=lambda v: v[1])[-10:]
    if not values:
        return False
    ax.set_facecolor(PANEL)
    ax.barh(
        [v[0] for v in values], [v[1] for v in values], color=[_color(panel, v[1]) for v in values]
    )
    for i, (_, value, _) in enumerate(values):
        ax.text(value, i, " " + _fmt(value, unit), va="center", fontsize=6, color=TEXT)
    ax.tick_params(colors=TEXT, labelsize=6)
    ax.xaxis.set_visible(False)
    for side in ax.spines.values():
        side.set_visible(False)
    return True


def _table(ax: Any, panel: dict, results: list, unit: str) -> bool:
    rows = [m for series in results for m in series]
    if not rows:
        return False
    first = ("rank", "node", "run", "alertname")
    found = dict.fromkeys(k for r in rows for k in r["metric"])
    keys = [k for k in first if k in found]
    keys += [k for k in found if k not in (*first, "__name__", "job", "instance", "cluster")]
    keys = keys[:8]
    several = len(panel["targets"]) > 1
    cells = [
        ([t.get("legendFormat") or t.get("refId", "")] if several else [])
        + [r["metric"].get(k, "") for k in keys]
        + [_fmt(_last(r), unit)]
        for t, series in zip(panel["targets"], results)
        for r in series
    ][:8]
    ax.axis("off")
    labels = (["query"] if several else []) + [*keys, "value"]
    table = ax.table(
        cellText=cells, colLabels=labels, loc="upper center", cellLoc="left", colLoc="left"
    )
    table.auto_set_font_size(False)
    table.set_fontsize(6)
    for cell in table.get_celld().values():
        cell.set_facecolor(PANEL)
        cell.set_edgecolor(GRID)
        cell.get_text().set_color(TEXT)
    return True


def draw(stem: str, board: dict, data: dict, out: Path) -> Path:
    """Draw one dashboard on its grid; return the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    col_in, row_in = 16 / 24, 0.36
    fig = plt.figure(figsize=(16, rows * row_in + 0.5), facecolor=BG)
    height = rows * row_in + 0.5
    moment = "rank 2 straggling" if data["end"] < data["events"][1][0] else "rank 2 hung"
    fig.text(
        0.01,
        1 - 0.3 / height,
        f"{board['title']}   (run = {RUN}; shown at "
        f"{data['end'] - data['started']:.0f} s: {moment})",
        color=TEXT,
        fontsize=11,
        va="center",
    )
    for panel, results in zip(board["panels"], data["panels"]):
        g = panel["gridPos"]
        left, width = g["x"] * col_in / 16, g["w"] * col_in / 16
        top = 0.5 + g["y"] * row_in
        box = fig.add_axes(
            (
                left + 0.003,
                1 - (top + g["h"] * row_in) / height + 0.004,
                width - 0.006,
                g["h"] * row_in / height - 0.008,
            )
        )
        box.set_facecolor(PANEL)
        box.set_xticks([])
        box.set_yticks([])
        for side in box.spines.values():
            side.set_color(GRID)
        box.set_title(panel["title"], color=TEXT, fontsize=7.5, loc="left", pad=3)
        pos = box.get_position()
        low = 0.3 if panel["type"] == "timeseries" else 0.1  # room for the legend below
        left = 0.2 if panel["type"] == "bargauge" else 0.08  # room for the bars' names
        inner = fig.add_axes(
            (
                pos.x0 + pos.width * left,
                pos.y0 + pos.height * low,
                pos.width * (0.96 - left),
                pos.height * (0.84 - low),
            )
        )
        unit = panel["fieldConfig"]["defaults"].get("unit", "short")
        if panel["type"] == "timeseries":
            drawn = _timeseries(inner, panel, results, data, unit)
        else:
            drawn = {"stat": _stat, "bargauge": _bars, "table": _table}[panel["type"]](
                inner, panel, results, unit
            )
        if not drawn:
            inner.axis("off")
            inner.text(
                0.5,
                0.5,
                "No data",
                ha="center",
                va="center",
                color=DIM,
                fontsize=8,
                transform=inner.transAxes,
            )
    path = out / f"dashboard-{stem}.png"
    fig.savefig(path, dpi=80, facecolor=BG)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        print("render: needs matplotlib: pip install 'ddp-exporter[docs]'", file=sys.stderr)
        return 2
    if args.load:
        data = json.loads(args.load.read_text())
    else:
        try:
            data = drill(args)
        except KeyboardInterrupt as exc:
            print("render: interrupted; every process it started is stopped", file=sys.stderr)
            return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
    if args.save:
        args.save.write_text(json.dumps(data))
    args.out.mkdir(parents=True, exist_ok=True)
    every = boards()
    for stem in DASHBOARDS:
        print(
            draw(
                stem,
                every[stem],
                {**data[stem], "events": data["events"], "started": data["started"]},
                args.out,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
