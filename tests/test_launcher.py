"""A hang abort ends in training again under every plain torchrun launch form.

The unit half reads the launch form from the environment, clears a real TCPStore of the keys a
real gloo process group wrote (and of nothing else), and says when the action must be refused.
The drill half runs tests/workers/restart_worker.py under each launch form people type: rank 1
blocks in user code at step 40 of the first attempt, the hang action (heartbeat 1 s, defaults
otherwise) ends every rank, torchrun restarts the job and it resumes from its checkpoint and
finishes. Under ``--standalone`` and static rendezvous torchrun's agent store is shared by every
attempt; before the exporter cleared it the restarted attempt failed with ``Connection refused``
or sat forever (issue 29).
"""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path

import pytest
import torch.distributed as dist
from harness import Job

from exporter import settings, storekeys
from exporter.sources import launcher
from exporter.tools.localstack import free_port

WORKER = os.path.join("tests", "workers", "restart_worker.py")
ABORT_LINE = "ddp-exporter: aborting run"

TORCHRUN = {settings.TORCHELASTIC_RUN_ID: "job", settings.TORCHELASTIC_RESTART_COUNT: "0"}


# -- the launch form ----------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize(
    ("env", "shared", "left", "in_place"),
    [
        ({}, False, None, False),  # srun / one process per rank
        (
            {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3"},
            True,
            3,
            True,
        ),  # --standalone, c10d or static: the agent's store, restarts left
        (
            {
                **TORCHRUN,
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_MAX_RESTARTS": "3",
                "TORCHELASTIC_RESTART_COUNT": "3",
            },
            True,
            0,
            False,
        ),  # the last attempt
        (
            {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_MAX_RESTARTS": "1"},
            False,
            1,
            False,
        ),  # c10d with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
        (
            {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "0"},
            True,
            0,
            False,
        ),  # no restarts: the abort ends the job
    ],
    ids=["srun", "shared", "last-attempt", "own-store", "no-restarts"],
)
def test_launch_form_from_the_environment(env, shared, left, in_place):
    form = launcher.launch(env)
    assert (form.shared_store, form.restarts_left, form.restarts_in_place) == (
        shared,
        left,
        in_place,
    )


def _server() -> dist.TCPStore:
    timeout = datetime.timedelta(seconds=10)
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False)


@pytest.mark.unit
def test_forget_attempt_deletes_the_process_groups_keys_and_nothing_else():
    """A real gloo group writes its pair addresses into a real agent-like store; only they go."""
    server = _server()
    root = dist.TCPStore("127.0.0.1", server.port, None, False)
    # What init_process_group builds: PrefixStore("default_pg") over the launcher's store, and
    # a prefix per group; the group's own keys come from gloo itself.
    default = dist.PrefixStore("default_pg", root)
    group = dist.PrefixStore("0/", default)
    dist.ProcessGroupGloo(dist.PrefixStore("cpu/", group), 0, 1)
    ours = storekeys.for_run("job", "0")
    group.set(ours.heartbeat(0), "1")  # the exporter's keys of this attempt (under the group)
    root.set(storekeys.for_init("job", "0").heartbeat(0), "1")  # the init watch's
    root.set("none/torchelastic/role_info/0", "agent")  # torchrun's own rendezvous
    root.set("user/key", "v")
    before = set(root.list_keys())
    stale = {k for k in before if k.startswith("default_pg/") and "ddp_exporter" not in k}
    assert stale, before  # gloo wrote its pair addresses

    assert launcher.forget_attempt(group) == len(stale)
    assert set(root.list_keys()) == before - stale
    assert launcher.forget_attempt(group) == 0  # idempotent


class _StoreWithoutListing:
    """Stands in for a c10d store of torch < 2.10, which has no ``list_keys`` (injected)."""

    def delete_key(self, key: str) -> bool:
        return False


SHARED = {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "2"}


@pytest.mark.unit
def test_restart_blocker_names_the_fix_only_where_a_restart_could_not_connect():
    server = _server()
    form = launcher.launch(SHARED)
    assert launcher.restart_blocker(form, server, "2.13.0") is None  # keys can be cleared
    assert launcher.restart_blocker(launcher.launch({}), _StoreWithoutListing(), "2.9.1") is None
    own = launcher.launch(dict(SHARED, TORCHELASTIC_USE_AGENT_STORE="False"))
    assert launcher.restart_blocker(own, _StoreWithoutListing(), "2.9.1") is None
    line = launcher.restart_blocker(form, _StoreWithoutListing(), "2.9.1")
    assert line is not None and "\n" not in line
    assert "with torch 2.9.1, its keys cannot be listed" in line, line
    assert "--rdzv-backend c10d" in line and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in line, line
    assert "torch 2.10 or later" in line, line


@pytest.mark.unit
def test_instrument_accepts_the_action_under_a_shared_store_it_can_clear(ddp, monkeypatch):
    import exporter

    for name, value in SHARED.items():
        monkeypatch.setenv(name, value)
    model, _, opt = ddp
    obs = exporter.instrument(model, optimizer=opt, port=0, on_hang="abort")
    assert obs.hangs is not None and obs.hangs.restarts is not None
    assert obs.hangs.restarts.limit == settings.DEFAULT_ABORT_LIMIT


# -- drills: one per launch form -------------------------------------------------------------------
def _node(i: int, nnodes: int, form: str, port: int) -> list[str]:
    """Return torchrun's options for node ``i`` of a ``form`` launch."""
    if form == "standalone":
        return ["--standalone"]
    if form.startswith("c10d"):
        return [
            "--nnodes",
            str(nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "drill",
        ]
    return [
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(i),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
    ]


FORMS = {
    # name: (form, nodes, ranks per node, culprit, TORCH_DISABLE_SHARE_RDZV_TCP_STORE)
    "standalone": ("standalone", 1, 3, 1, False),  # what people type: the shared agent store
    "c10d-own-store": ("c10d", 1, 3, 1, True),  # a store per attempt, hosted by rank 0
    "static": ("static", 1, 3, 1, False),  # always shared
    "static-2-nodes": ("static", 2, 2, 3, False),  # the culprit on the second node
    "c10d-2-nodes": ("c10d", 2, 2, 2, False),  # shared by default
}


def _start(tmp_path: Path, name: str) -> list[Job]:
    """Start every torchrun (node) of one launch form's job; rank ``culprit`` hangs at step 40."""
    form, nnodes, nproc, culprit, own_store = FORMS[name]
    port, workdir = free_port(), tmp_path / name
    workdir.mkdir()
    args = [str(workdir), "--stuck", f"{culprit}:40", "--steps", "100"]
    jobs: list[Job] = []
    for i in range(nnodes):
        env = {
            "OMP_NUM_THREADS": "1",
            "DDP_EXPORTER_ON_HANG": "abort",
            "DDP_EXPORTER_HEARTBEAT_S": "1",
            "DDP_EXPORTER_DUMP_DIR": str(workdir / f"dumps-{i}"),
            "DDP_EXPORTER_NODE": f"node-{i}",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1" if own_store else "0",
        }
        extra = [*_node(i, nnodes, form, port), "--max-restarts", "1"]
        jobs.append(Job(nproc, args, env=env, module=WORKER, torchrun=extra))
    return jobs


def _check(tmp_path: Path, name: str, jobs: list[Job], codes: list[int]) -> None:
    """Assert that the job of launch form ``name`` aborted once, resumed and finished."""
    _, nnodes, nproc, culprit, _ = FORMS[name]
    world = nnodes * nproc
    text = "".join(job.text() for job in jobs)
    assert codes == [0] * nnodes, (name, text)
    assert "Connection refused" not in text, (name, text)
    lines = [line for line in text.splitlines() if ABORT_LINE in line]
    assert len(lines) == world, (name, text)  # every rank of the first attempt left
    # c10d rendezvous may put any rank on either node: find the culprit's torchrun.
    (host,) = (
        f"node-{i}"
        for i, job in enumerate(jobs)
        if f"rank {culprit}: attempt 0 resumed" in job.text()
    )
    assert all(f"rank {culprit} (node {host}) never entered" in line for line in lines), lines
    resumed = {int(s) for s in re.findall(r"attempt 1 resumed at step (\d+)", text)}
    assert resumed == {40}, (name, text)  # the checkpoint written just before the hang
    assert text.count("finished at step 100") == world, (name, text)
    # The first node's local rank 0 keeps a copy of the run's ledger and the launcher's line.
    (line,) = (tmp_path / name / "dumps-0").glob("*-abort.txt")
    assert line.read_text().startswith("requeue=yes exit_code=75 attempt=0 "), line.read_text()
    assert f"culprit_ranks={culprit} culprit_nodes={host} " in line.read_text(), name


@pytest.mark.job
def test_the_job_resumes_and_finishes_under_every_launch_form(tmp_path: Path):
    """Every launch form's job at once (they idle through the 20 s hang): each resumes."""
    running: dict[str, list[Job]] = {}
    try:
        for name in FORMS:
            running[name] = _start(tmp_path, name)
        codes = {name: [job.wait(300) for job in jobs] for name, jobs in running.items()}
    finally:
        for jobs in running.values():
            for job in jobs:
                job.stop()
    for name, jobs in running.items():
        _check(tmp_path, name, jobs, codes[name])
