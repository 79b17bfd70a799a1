"""Sharding drill: two Prometheus shards under a global server, all real processes.

Two gloo jobs of three ranks (one process per rank) write their file_sd targets into one
folder; both shards discover them all and keep, by ``hashmod`` over ``run``, only the runs that
hash to them (one run each). Each shard evaluates the per-run rules (FAST) for its run; the
global server federates the firing accusations and ``ddp_rank_info`` from both and evaluates the
fleet group. The ``bad`` node's rank is throttled in both jobs, so it is blamed from two shards:
DDPSuspectNode fires on the global server exactly once, for ``bad`` of cluster ``lab``; no
shard evaluates it. Then shard 1 stops: DDPShardDown names it and no node becomes suspect.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from harness import Ranks, child_env, wait_for
from promstack import file_sd_scrape, require, run_prometheus

from exporter.deploy import sharding
from exporter.mixin.config import DEFAULT, FAST, config_json
from exporter.mixin.fleet import FLEET_INPUT_ALERTS
from exporter.mixin.render import dump_yaml

#: Long enough for the straggler alert (FAST: 20 s rate window, 30 s for) under load.
DURATION = 90
NODES = (["bad", "n1", "n2"], ["n3", "bad", "n4"])


def _runs() -> list[str]:
    """Return one run name per shard (Prometheus's hashmod, computed the same way here)."""
    names = [f"shard-run-{i}" for i in range(50)]
    return [next(n for n in names if sharding.shard_of(n, 2) == s) for s in (0, 1)]


def _start(run: str, nodes: list[str], slow: int, sd: Path) -> Ranks:
    cmd = [
        "-m",
        "exporter.tools.trainer",
        "--duration",
        str(DURATION),
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
        "--heartbeat",
        "1",
        "--run",
        run,
        "--timeout",
        "120",
        "--step-time",
        "0.1",
        "--fault",
        "straggler",
        "--fault-rank",
        str(slow),
        "--fault-after",
        "0",
        "--straggle",
        "0.15",
    ]
    return Ranks(
        len(nodes),
        cmd,
        env={"OMP_NUM_THREADS": "1", "DDP_EXPORTER_FILE_SD": str(sd)},
        per_rank={r: {"DDP_EXPORTER_NODE": node} for r, node in enumerate(nodes)},
    )


def _shard_config(workdir: Path, index: int, sd: Path) -> dict:
    """Return shard ``index``'s config: per-run rules only, its runs only, cluster lab."""
    workdir.mkdir(parents=True, exist_ok=True)
    rules = workdir / "rules.yml"
    rules.write_text(dump_yaml(sharding.shard_rule_groups(FAST)))
    base = {
        # Scrape timeouts differ: the exporter tells scrapers on one host apart by them.
        "global": {
            "scrape_interval": "1s",
            "evaluation_interval": "1s",
            "scrape_timeout": f"{900 - 100 * index}ms",
        },
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": FAST.job, "honor_labels": True, **file_sd_scrape(sd)}],
    }
    return sharding.shard_config(FAST, index, 2, base, external_labels={"cluster": "lab"})


def _global_config(workdir: Path, shards: list[str]) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    rules = workdir / "rules.yml"
    rules.write_text(dump_yaml(sharding.global_rule_groups(FAST)))
    return sharding.global_config(FAST, shards, rule_files=[str(rules)], interval="1s")


def _firing(prom, alertname: str) -> list[dict]:
    query = f'ALERTS{{alertname="{alertname}", alertstate="firing"}}'
    return [s["metric"] for s in prom.query(query)]


@pytest.mark.stack
def test_two_shards_and_a_global_server_name_the_bad_node_once(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    sd.mkdir()
    runs = _runs()
    with (
        run_prometheus(tmp_path / "shard0", _shard_config(tmp_path / "shard0", 0, sd)) as shard0,
        run_prometheus(tmp_path / "shard1", _shard_config(tmp_path / "shard1", 1, sd)) as shard1,
    ):
        shards = [s.url.split("//")[1] for s in (shard0, shard1)]
        glob_dir = tmp_path / "global"
        with run_prometheus(glob_dir, _global_config(glob_dir, shards)) as glob:
            jobs = []
            try:
                for run, nodes, slow in zip(runs, NODES, (0, 1)):
                    jobs.append(_start(run, nodes, slow, sd))
                # Every run's ranks on its own shard, none on the other.
                for shard, run in zip((shard0, shard1), runs):
                    wait_for(lambda s=shard: len(s.targets_up()) == 3, 90, "a shard's 3 ranks")
                    assert {t["labels"]["run"] for t in shard.targets_up()} == {run}
                for ranks in jobs:
                    codes = ranks.wait(timeout=DURATION + 180)
                    assert set(codes.values()) == {0}, ranks.output()[-3000:]
            finally:
                for ranks in jobs:
                    ranks.stop()
            # Each shard accused the bad node's rank of its own run, and judged no node.
            for shard, run, slow in zip((shard0, shard1), runs, (0, 1)):
                got = shard.query(
                    f'max_over_time(ALERTS{{alertname="DDPRankStraggler", '
                    f'alertstate="firing", run="{run}"}}[10m])'
                )
                assert {s["metric"]["rank"] for s in got} == {str(slow)}, got
                assert not shard.query('ALERTS{alertname="DDPSuspectNode"}')

            def suspects() -> list[tuple[str, str]]:
                return [(a.get("cluster", ""), a["node"]) for a in _firing(glob, "DDPSuspectNode")]

            wait_for(lambda: suspects() == [("lab", "bad")], 60, "DDPSuspectNode on the global")
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "exporter.tools.cli",
                    "nodes",
                    "--prometheus",
                    glob.url,
                    "--config",
                    _fast_config(tmp_path),
                    "--cluster",
                    "lab",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                env=child_env(),
            )
            assert out.returncode == 0, out.stderr
            assert out.stdout.splitlines()[2].split()[:4] == ["lab/bad", "2", "2", "2"], out.stdout
            assert out.stdout.count("SUSPECT") == 1, out.stdout

            # A shard down: seen on the global server, and no node is blamed for the gap.
            shard1.process.terminate()
            shard1.process.wait(30)
            wait_for(
                lambda: [a["instance"] for a in _firing(glob, "DDPShardDown")] == [shards[1]],
                60,
                "DDPShardDown for shard 1",
            )
            assert suspects() == [("lab", "bad")]


@pytest.mark.tool
def test_the_generated_sharded_deployment_is_valid_and_splits_runs(tmp_path: Path) -> None:
    files = sharding.render_sharded(replace(DEFAULT, shards=4))
    shard_files = sorted(p for p in files if "prometheus-shard-" in p)
    assert len(shard_files) == 4
    keep = [
        yaml.safe_load(files[p])["scrape_configs"][0]["relabel_configs"][-1] for p in shard_files
    ]
    assert [k["regex"] for k in keep] == ["0", "1", "2", "3"]
    assert {
        yaml.safe_load(files[p])["global"]["external_labels"]["shard"] for p in shard_files
    } == {"0", "1", "2", "3"}
    glob = yaml.safe_load(files["deploy/sharded/prometheus-global.yml"])
    assert glob["scrape_configs"][0]["static_configs"][0]["targets"] == [
        f"prometheus-shard-{i}:9090" for i in range(4)
    ]
    # The shards never judge nodes, the global server judges nothing else.
    shard_rules = yaml.safe_load(files["deploy/sharded/rules-shard.yml"])["groups"]
    global_rules = yaml.safe_load(files["deploy/sharded/rules-global.yml"])["groups"]
    assert "ddp-exporter.fleet" not in [g["name"] for g in shard_rules]
    assert [g["name"] for g in global_rules] == ["ddp-exporter.fleet"]
    promtool = require("promtool")
    for rel, text in files.items():
        path = tmp_path / Path(rel).name
        path.write_text(text)
        kind = "rules" if "rules-" in rel else "config"
        cmd = [promtool, "check", kind, *(["--syntax-only"] if kind == "config" else []), str(path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, (rel, proc.stdout + proc.stderr)
    # The global server federates every alert the fleet group reads, and only the firing ones.
    fleet_exprs = " ".join(r["expr"] for g in global_rules for r in g["rules"])
    read = set()
    for names in re.findall(r'alertname=~?"([^"]+)"', fleet_exprs):
        read |= set(names.split("|"))
    assert read - {"DDPSuspectNode"} == set(FLEET_INPUT_ALERTS), read
    match = glob["scrape_configs"][0]["params"]["match[]"]
    assert (
        all(name in match[0] for name in FLEET_INPUT_ALERTS) and 'alertstate="firing"' in match[0]
    )
    with pytest.raises(ValueError, match="not in 0..1"):
        sharding.shard_relabel(2, 2)
    with pytest.raises(ValueError, match="no scrape job"):
        sharding.shard_config(DEFAULT, 0, 2, {"global": {}, "scrape_configs": []})
    with pytest.raises(ValueError, match="at least one shard"):
        sharding.global_config(DEFAULT, [], rule_files=[])
    with pytest.raises(ValueError, match="shards must be"):
        replace(DEFAULT, shards=0)


def _fast_config(directory: Path) -> str:
    """Write the FAST config as ``nodes`` reads it (what the rules were made of)."""
    path = directory / "mixin.json"
    path.write_text(config_json(FAST))
    return str(path)
