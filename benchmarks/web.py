"""What serving over TLS with basic authentication costs a rank: per scrape, and per step.

One process trains a small host-bound model (a step of a few milliseconds, the case where any
work on the rank's own CPU shows) and serves its registry through ``MetricsServer``; a second
process scrapes it ``--rate`` times a second on a fresh connection each time, as Prometheus
does. Arms, rotated per round: no scraper, plain HTTP, TLS, TLS with a client certificate and
basic authentication (bcrypt). Reported per arm: the median step, its ratio to no scraper, the
scrape's round trip and the server's CPU per scrape (the training process's CPU time beyond
the no-scraper arm's, divided by the scrapes). Certificates are made with ``openssl``; needs
the ``web`` extra.

    python benchmarks/web.py
    python benchmarks/web.py --rate 10 --rounds 6 --seconds 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

import torch  # noqa: E402
from prometheus_client import CollectorRegistry, Counter, Histogram  # noqa: E402
from webpki import PASSWORD, USER, bcrypt_hash, fetch, make_pki, write_config  # noqa: E402

from exporter.export.server import MetricsServer  # noqa: E402

ARMS = ("none", "plain", "tls", "tls+auth")


def _registry() -> CollectorRegistry:
    """About a rank's worth of series: 150 samples."""
    reg = CollectorRegistry()
    h = Histogram(
        "ddp_bench_seconds", "x", ["op"], registry=reg, buckets=[i / 10 for i in range(12)]
    )
    c = Counter("ddp_bench_total", "x", ["kind"], registry=reg)
    for i in range(8):
        h.labels(f"op{i}").observe(0.1 * i)
        c.labels(f"k{i}").inc(i)
    return reg


def _scraper(url: str, kwargs: dict, rate: float, stop, times) -> None:
    period = 1.0 / rate
    nxt = time.monotonic()
    while not stop.is_set():
        t0 = time.perf_counter()
        status, _ = fetch(url, **kwargs)
        assert status == 200, status
        times.append(time.perf_counter() - t0)
        nxt += period
        time.sleep(max(0.0, nxt - time.monotonic()))


def _configs(folder: Path) -> dict[str, tuple[str | None, dict]]:
    pki = make_pki(folder / "pki")
    tls = [
        "tls_server_config:",
        f"  cert_file: {pki.path('server.crt')}",
        f"  key_file: {pki.path('server.key')}",
    ]
    auth = [
        "  client_auth_type: RequireAndVerifyClientCert",
        f"  client_ca_file: {pki.path('ca.crt')}",
        "basic_auth_users:",
        f"  {USER}: {bcrypt_hash()}",
    ]
    plain_tls = write_config(folder / "tls.yml", "\n".join(tls) + "\n")
    full = write_config(folder / "auth.yml", "\n".join(tls + auth) + "\n")
    client = {"ca": pki.path("ca.crt")}
    return {
        "plain": (None, {}),
        "tls": (str(plain_tls), client),
        "tls+auth": (str(full), {**client, "cert": pki.pair("client"), "user": (USER, PASSWORD)}),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=10.0, help="scrapes per second")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=4.0, help="per arm per round")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(32, 256)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        configs = _configs(Path(tmp))
        steps: dict[str, list[float]] = {a: [] for a in ARMS}
        cpu: dict[str, list[float]] = {a: [] for a in ARMS}
        rtt: dict[str, list[float]] = {a: [] for a in ARMS}
        for r in range(args.rounds):
            order = ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]
            for arm in order:
                server = scraper = None
                manager = ctx.Manager()
                stop, times = manager.Event(), manager.list()
                if arm != "none":
                    path, kwargs = configs[arm]
                    server = MetricsServer(_registry(), "127.0.0.1", 0, web_config=path)
                    server.start()
                    url = f"{server.scheme}://localhost:{server.port}/metrics"
                    scraper = ctx.Process(
                        target=_scraper, args=(url, kwargs, args.rate, stop, times)
                    )
                    scraper.start()
                    time.sleep(1.0)  # the scraper's interpreter up and scraping
                c0, t_end, n = time.process_time(), time.monotonic() + args.seconds, 0
                per = []
                while time.monotonic() < t_end:
                    t0 = time.perf_counter()
                    model(x).sum().backward()
                    opt.step()
                    opt.zero_grad()
                    per.append(time.perf_counter() - t0)
                    n += 1
                cpu[arm].append((time.process_time() - c0) / args.seconds)
                steps[arm].append(statistics.median(per))
                stop.set()
                if scraper is not None:
                    scraper.join(30)
                    rtt[arm].extend(times)
                if server is not None:
                    server.close()
                manager.shutdown()
        base_step = statistics.median(steps["none"])
        base_cpu = statistics.median(cpu["none"])
        print(
            f"{'arm':10} {'step ms':>8} {'ratio':>6} {'scrape ms':>9} {'server CPU/scrape ms':>21}"
        )
        for arm in ARMS:
            step = statistics.median(steps[arm])
            scrape = statistics.median(rtt[arm]) * 1e3 if rtt[arm] else float("nan")
            extra = (
                (statistics.median(cpu[arm]) - base_cpu) / args.rate * 1e3 if arm != "none" else 0.0
            )
            print(f"{arm:10} {step * 1e3:8.3f} {step / base_step:6.3f} {scrape:9.2f} {extra:21.2f}")
        tls = statistics.median(steps["tls+auth"]) / statistics.median(steps["plain"])
        print(f"tls_auth_over_plain_step_ratio={tls:.3f}")


if __name__ == "__main__":
    main()
