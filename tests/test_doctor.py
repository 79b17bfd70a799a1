"""ddp-exporter doctor: real ranks under torchrun or started one process per rank (srun style)."""

from __future__ import annotations

import re
import time

import pytest
import torch
from harness import Job, Ranks, free_port

from exporter import settings
from exporter.network import netcheck
from exporter.tools import doctor
from exporter.tools.doctor import Check, Report

# --- pure parts: no processes ------------------------------------------------------------------


@pytest.mark.unit
def test_env_check_names_what_is_missing_or_wrong():
    good = {"MASTER_ADDR": "h", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2"}
    assert doctor.check_env({**good, "LOCAL_RANK": "0"}).status == "ok"
    miss = doctor.check_env(good)
    assert miss.failed and "LOCAL_RANK" in miss.detail and "torchrun" in miss.fix
    bad = doctor.check_env({**good, "LOCAL_RANK": "0", "RANK": "2"})
    assert bad.failed and "RANK=2" in bad.detail
    port = doctor.check_env({**good, "LOCAL_RANK": "0", "MASTER_PORT": "70000"})
    assert port.failed and "MASTER_PORT=70000" in port.detail


@pytest.mark.unit
def test_ifname_check_follows_gloo_and_nccl_syntax():
    have = ["eth0", "ib0", "lo"]
    assert doctor.check_ifnames({}, have).status == "-"
    assert doctor.check_ifnames({"GLOO_SOCKET_IFNAME": "eth0,lo"}, have).status == "ok"
    assert doctor.check_ifnames({"NCCL_SOCKET_IFNAME": "eth"}, have).status == "ok"  # prefix
    assert doctor.check_ifnames({"NCCL_SOCKET_IFNAME": "^docker"}, have).status == "ok"
    bad = doctor.check_ifnames({"GLOO_SOCKET_IFNAME": "eth0,eth9"}, have)
    assert bad.failed and "eth9" in bad.detail and "eth0, ib0, lo" in bad.fix
    exact = doctor.check_ifnames({"NCCL_SOCKET_IFNAME": "=eth"}, have)
    assert exact.failed and "NCCL_SOCKET_IFNAME==eth" in exact.detail


@pytest.mark.unit
def test_fake_versions_override_is_validated():
    fake = {settings.DOCTOR_FAKE_VERSIONS: "torch=9.9.9, cuda=12.1"}
    v = doctor.local_versions(fake)
    assert v["torch"] == "9.9.9" and v["cuda"] == "12.1"
    assert doctor.local_versions({})["torch"] == torch.__version__
    # Not KEY=VERSION: logged, and no override (exporter.settings never raises).
    assert doctor.local_versions({settings.DOCTOR_FAKE_VERSIONS: "gcc=13"})["torch"] == (
        torch.__version__
    )


def _report(rank, world=3, host="n1", local=None, **versions):
    checks = doctor.Checks(**{name: Check("ok") for name in doctor.CHECKS})
    base = {"python": "3.11", "torch": "2.13", "cuda": "none", "nccl": "none"}
    return Report(
        rank,
        world,
        rank if local is None else local,
        host,
        100 + rank,
        {**base, **versions},
        checks,
    )


@pytest.mark.unit
def test_compare_names_duplicate_ranks_other_world_size_and_skew():
    reps = [_report(0), _report(1), _report(1, host="n2"), _report(2, world=4, host="n3")]
    rows, notes = doctor.compare(reps, 3)
    assert [r.rank for r in rows] == [0, 1, 1, 2]
    assert "claimed by 2 processes" in reps[1].checks.env.detail
    assert "WORLD_SIZE=4 here, 3 on rank 0" in reps[3].checks.env.detail
    assert not reps[0].failures() and not notes
    skew = [_report(0), _report(1, cuda="12.1"), _report(2, cuda="12.4", host="n2")]
    rows, notes = doctor.compare(skew, 4)
    assert rows[-1] == 3  # never reported: a missing row
    # A three-way tie: rank 0's value is the reference, the others are named.
    assert notes == [
        "version skew: cuda differs: rank 1 has 12.1; rank 2 has 12.4, rank 0 has none"
    ]
    text = doctor.render(rows, notes, "start it")
    assert re.search(r"^3\s+\?\s+missing$", text, re.M)
    assert "FAIL rank 3 missing: start it" in text and "FAIL rank 2 versions: cuda 12.4" in text


# --- real ranks --------------------------------------------------------------------------------


def _table(text: str) -> dict[str, dict[str, str]]:
    """Parse rank 0's table into ``{rank: {column: status}}``."""
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line.split()[:2] == ["rank", "host"]]
    assert heads, f"no table in:\n{text}"
    start = heads[0]
    header = lines[start].split()
    rows = {}
    for line in lines[start + 1 :]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def _doctor_ranks(world: int, ranks: list[int], args: list[str], per_rank=None) -> Ranks:
    """Start one doctor process per rank with its own env (like srun)."""
    return Ranks(
        world,
        ["-m", "exporter.doctor", *args],
        env={"OMP_NUM_THREADS": "1"},
        per_rank=per_rank,
        ranks=ranks,
    )


@pytest.mark.job
def test_healthy_torchrun_job_passes_every_check():
    with Job(
        3, ["doctor", "--timeout", "60"], env={"OMP_NUM_THREADS": "1"}, module="exporter.tools.cli"
    ) as job:
        code = job.wait(timeout=180)
        out = job.text()
        assert code == 0, out
        rows = _table(out)
        assert sorted(rows) == ["0", "1", "2"], out
        for rank, row in rows.items():
            assert [row[c] for c in ("env", "addr", "port", "store", "gloo", "versions")] == [
                "ok"
            ] * 6, (rank, out)
        assert "torchrun agent store" in out
        assert f"torch {torch.__version__}" in out and "on every rank" in out
        assert "all checks passed" in out and "FAIL" not in out


# Short steps, and an overall deadline stated for a loaded machine: the others wait for rank 0's
# store until 24 s, and rank 0 may start many seconds after them while two cores import torch for
# a dozen processes.
SHORT = ["--timeout", "30", "--step-timeout", "4"]


@pytest.mark.job
def test_wrong_master_port_fails_that_rank_with_the_fix():
    wrong = free_port()  # nothing listens there
    args = SHORT
    with _doctor_ranks(3, [0, 1, 2], args, {2: {"MASTER_PORT": str(wrong)}}) as ranks:
        codes = ranks.wait(timeout=150)
        own = ranks.out(2)
        assert codes[2] == 1, ranks.output()
        assert f"rank 2: FAIL port: MASTER_ADDR:MASTER_PORT 127.0.0.1:{wrong} refused" in own
        assert "Fix: nothing listens there" in own
        rows = _table(ranks.out(0))
        assert rows["2"]["env"] == "missing" and rows["1"]["port"] == "ok", ranks.output()
        assert "FAIL rank 2 missing" in ranks.out(0)
        assert codes[0] == 1 and codes[1] == 1, ranks.output()


@pytest.mark.job
def test_missing_rank_is_named_and_doctor_ends_within_its_deadline():
    args = SHORT
    with _doctor_ranks(3, [0, 1], args) as ranks:
        codes = ranks.wait(timeout=150)
        wall = time.monotonic() - ranks.started
        out = ranks.out(0)
        assert codes == {0: 1, 1: 1}, ranks.output()
        rows = _table(out)
        assert rows["2"]["env"] == "missing" and rows["1"]["store"] == "ok", ranks.output()
        assert rows["0"]["gloo"] == "skip"  # no collective without every rank: it would hang
        assert "gloo all_reduce skipped" in out
        assert "FAIL rank 2 missing: it never reported" in out
        took = float(re.search(r"FAIL after ([\d.]+) s", out).group(1))
        assert took <= 30, out  # the doctor's own clock, from its start to the table
        # Whole processes (torch import included, on a loaded 2-core machine): generous.
        assert wall < 30 + doctor.VERDICT_GRACE_S + 60, wall


# Rank 0 starts later than a step lasts, as on a slow node: the others wait for its store.
LATE_START_S = 8


def _late_rank0(args: list[str]):
    def cmd(rank: int) -> list[str]:
        if rank:
            return ["-m", "exporter.doctor", *args]
        code = (
            f"import sys, time; time.sleep({LATE_START_S}); "
            "from exporter.tools.doctor.command import main; sys.exit(main(sys.argv[1:]))"
        )
        return ["-c", code, *args]

    return cmd


@pytest.mark.job
def test_version_skew_names_the_rank_and_the_versions_though_rank_0_starts_late():
    fake = {1: {settings.DOCTOR_FAKE_VERSIONS: "torch=9.9.9"}}
    args = ["--timeout", "60", "--step-timeout", str(LATE_START_S / 2)]
    with Ranks(3, _late_rank0(args), env={"OMP_NUM_THREADS": "1"}, per_rank=fake) as ranks:
        codes = ranks.wait(timeout=150)
        out = ranks.out(0)
        assert codes == {0: 1, 1: 1, 2: 1}, ranks.output()
        rows = _table(out)
        assert [rows[r]["port"] for r in "12"] == ["ok", "ok"], ranks.output()
        assert [rows[r]["versions"] for r in "012"] == ["ok", "FAIL", "ok"], out
        assert all(rows[r]["gloo"] == "ok" for r in "012"), out
        want = f"torch differs: rank 1 has 9.9.9, ranks 0,2 have {torch.__version__}"
        assert want in out
        assert f"FAIL rank 1 versions: torch 9.9.9, not {torch.__version__} like ranks 0,2" in out


class _StoreWithoutListing:
    """Stands in for a c10d store of torch < 2.10, which has no ``list_keys`` (injected)."""

    def delete_key(self, key: str) -> bool:
        return False


@pytest.mark.unit
def test_restart_check_by_launch_form():
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), wait_for_workers=False
    )
    shared = {
        "TORCHELASTIC_RUN_ID": "j",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_MAX_RESTARTS": "2",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }
    abort = {**shared, settings.ON_HANG: "abort"}
    check = doctor.check_restart
    assert check({}, store, "2.13.0").status == "-"  # not torchrun
    assert check({**shared, "TORCHELASTIC_MAX_RESTARTS": "0"}, store, "2.13.0").status == "-"
    own = check({**shared, "TORCHELASTIC_USE_AGENT_STORE": "False"}, store, "2.13.0")
    assert own.status == "ok", own
    assert check(abort, store, "2.13.0").status == "ok"
    warn = check(shared, store, "2.13.0")
    assert warn.status == "warn" and not warn.failed and "pytorch/pytorch#167288" in warn.detail
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in warn.fix
    fail = check(abort, _StoreWithoutListing(), "2.9.1")
    assert fail.failed and "torch 2.9.1" in fail.detail and "--rdzv-backend c10d" in fail.fix


@pytest.mark.job
@pytest.mark.parametrize(
    ("env", "status"),
    [({}, "warn"), ({settings.ON_HANG: "abort"}, "ok")],
    ids=["restarts-after-a-crash", "hang-action"],
)
def test_standalone_with_restarts_flags_the_shared_store(env, status):
    with Job(
        2,
        ["doctor", "--timeout", "60"],
        env={"OMP_NUM_THREADS": "1", **env},
        module="exporter.tools.cli",
        torchrun=["--standalone", "--max-restarts", "1"],
    ) as job:
        code = job.wait(timeout=180)
        out = job.text()
        assert code == 0, out  # a warning is no failure
        rows = _table(out)
        assert [rows[r]["restart"] for r in "01"] == [status] * 2, out
        assert ("WARN ranks 0,1 restart: torchrun may restart this job" in out) is (
            status == "warn"
        ), out


@pytest.mark.unit
def test_reach_blames_the_rank_most_others_cannot_connect_to():
    reps = [_report(r, 4, host=f"node{r}") for r in range(4)]
    for r in reps:
        r.reach, r.reach_why = f"10.0.0.{r.rank}:4000", "the hostname"
    reps[2].reach_why = "GLOO_SOCKET_IFNAME=eth1"
    # Rank 2's address answers nobody; rank 3 alone cannot reach rank 0 (one pair, no blame).
    failed = {
        0: {2: "dropped"},
        1: {2: "dropped"},
        2: {0: "dropped", 1: "dropped", 3: "dropped"},
        3: {2: "unreachable", 0: "refused"},
    }
    checks, notes = doctor.judge_reach(reps, failed, 4)
    assert [checks[r].status for r in range(4)] == [doctor.OK, doctor.OK, doctor.FAIL, doctor.FAIL]
    assert "from ranks 0,1,3 (dropped, unreachable)" in checks[2].detail
    assert "GLOO_SOCKET_IFNAME on node2" in checks[2].fix
    assert checks[3].detail == "cannot reach rank 0 on their gloo addresses"
    assert notes == ["reach: the other ranks cannot connect to rank 2 on node2"]
    # A hostname that resolves to loopback (Debian's 127.0.1.1): gloo advertises it.
    reps[2].reach, reps[2].reach_why = "127.0.1.1:4000", "the hostname node2"
    checks, _ = doctor.judge_reach(reps, failed, 4)
    assert "advertises a loopback address (the hostname node2)" in checks[2].fix
    assert netcheck.gloo_address({"GLOO_SOCKET_IFNAME": "lo"}) == (
        "127.0.0.1",
        "GLOO_SOCKET_IFNAME=lo",
    )
    # A rank whose results never came is failed, not blamed; nobody tried it either.
    checks, notes = doctor.judge_reach(reps, {0: {}, 1: {}, 2: {}}, 4)
    assert checks[3].status == doctor.FAIL and "no result" in checks[3].detail and notes == []
    assert doctor.reach_targets(5, 100) == [1, 2, 3, 4, 6, 7, 8, 9]
    assert doctor.reach_targets(0, 3) == [1, 2]


@pytest.mark.unit
def test_links_schedule_pairs_every_node_once_per_round_and_judge_by_best_link():
    from exporter.network import links

    for n in range(2, 9):
        rounds = links.rounds(n)
        pairs = [p for r in rounds for p in r]
        assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)], n
        for r in rounds:
            used = [x for p in r for x in p]
            assert len(used) == len(set(used)), (n, r)  # one pair per node per round
    fast, slow = 2e9, 2.4e6
    pairs = [
        links.Pair("n0", "n1", fast, 3e-4),
        links.Pair("n0", "n2", slow, 3e-4),
        links.Pair("n1", "n2", slow, 3e-4),
        links.Pair("n0", "n3", fast, 3e-4),
        links.Pair("n1", "n3", fast, 3e-4),
        links.Pair("n2", "n3", slow, 3e-4),
    ]
    judged = links.judge(pairs)
    assert (
        list(judged) == ["n2"]
        and "2.4 MB/s, 833x below the median node's 2.00 GB/s" in judged["n2"]
    )
    assert links.representatives(["a", "b", "a", "c"]) == {"a": 0, "b": 1, "c": 3}
    assert links.judge(pairs[:1]) == {}  # two nodes: no third to tell which end is slow
    # Uneven but healthy links (within RATIO of each other) blame nobody.
    assert (
        links.judge(
            [
                links.Pair("a", "b", 1e9, 0),
                links.Pair("a", "c", 5e8, 0),
                links.Pair("b", "c", 4e8, 0),
            ]
        )
        == {}
    )
    assert links.render(pairs[:2], 4)[1].split() == [
        "n0",
        "<->",
        "n2",
        "2.4",
        "MB/s",
        "rtt",
        "0.30",
        "ms",
    ]
