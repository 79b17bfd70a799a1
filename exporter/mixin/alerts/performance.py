"""Build the performance alerts: stragglers, input-bound ranks, throughput drops, GPU memory.

A straggler shows the SHORTEST collective latency because its peers wait for it inside the
allreduce, so stragglers are blamed by compute and data time per step against the run's median
rank, never by collective latency; a slow link, which slows every rank alike, is named by the
c10d-store round trips of the ranks behind it, or, when the slow link is the store's own node's,
by the round trips of every other node (inflated) against its own (not: the store is local).
"""

from __future__ import annotations

from textwrap import indent

from ... import catalog
from ..alert import Alert, selector
from ..cluster import clauses
from ..config import DEFAULT, MixinConfig
from ..recording import BLAME_PHASES, recorded
from .shared import WHERE, slower_than_peers

__all__ = [
    "gpu_memory_near_limit",
    "input_bound",
    "performance_alerts",
    "rank_straggler",
    "throughput_drop",
]


def performance_alerts(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return DDPRankStraggler, DDPInputBound, DDPThroughputDrop and DDPGPUMemoryNearLimit."""
    return [rank_straggler(cfg), input_bound(cfg), throughput_drop(cfg), gpu_memory_near_limit(cfg)]


def _straggler_expr(cfg: MixinConfig) -> str:
    """Return the ranks slow by compute or data (cause=phase), or behind a slow link."""
    r, c = recorded(cfg), clauses(cfg)
    blame = "|".join(BLAME_PHASES)
    rank, run = c.on("run, rank"), c.on("run")
    slow = indent(slower_than_peers(cfg, f'phase=~"{blame}"'), "    ")
    waits = f'{rank} ({r.phase_share}{{phase="comm_wait"}} > {cfg.link_comm_share:g})'
    nodes = (
        f"count {c.by('run')} (count {c.by('run, node')} ({selector(cfg, catalog.RANK_INFO.name)}))"
    )
    return (
        f"max {c.by('run, rank, cause')} (\n  label_replace(\n"
        f"{slow},\n"
        '    "cause", "$1", "phase", "(.*)"\n  )\n)\n'
        # A slow link slows every rank alike: no rank's compute stands out, but the store
        # round trips of the ranks behind that link do (exporter.sources.heartbeat). On one
        # node no network lies between the ranks and the store: a slow round trip there is
        # CPU contention, no link.
        f"or\nmax {c.by('run, rank, cause')} (\n  label_replace(\n"
        f"    ({r.store_rtt_ratio} > {cfg.link_rtt_ratio:g})\n"
        f"    and {rank} ({r.store_rtt_rank} > {cfg.link_min_rtt_seconds:g})\n"
        f"    and {waits}\n"
        f"    unless {run} ({nodes} == 1),\n"
        '    "cause", "link", "", ""\n  )\n)\n'
        # The store's own node's link: its ranks reach the store locally, so every other
        # node's round trip is inflated (the run's median) and theirs is not. With two nodes
        # either end's slow link inflates the same one: three nodes at least.
        f"or\nmax {c.by('run, rank, cause')} (\n  label_replace(\n"
        f"    ({r.store_rtt_ratio} < {1 / cfg.link_rtt_ratio:g})\n"
        f"    and {run} ({r.store_rtt_run} > {cfg.link_min_rtt_seconds:g})\n"
        f"    and {waits}\n"
        f"    and {run} ({nodes} >= 3),\n"
        '    "cause", "link", "", ""\n  )\n)'
    )


def rank_straggler(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPRankStraggler: one rank slower than its peers holds the whole job back."""
    return Alert(
        "DDPRankStraggler",
        "warning",
        _straggler_expr(cfg),
        cfg.straggler_for,
        "One rank is slower than its peers and holds the whole job back.",
        (
            '{{ if and (eq $labels.cause "link") (lt $value 1.0) }}'
            f"{WHERE.capitalize()} runs on the node of the c10d store, and every other node's "
            f"round trips to the store (their median) take over {cfg.link_rtt_ratio:g}x its own "
            "while every rank waits on communication: the network link of the "
            "store's node is slow (a degraded NIC or cable, or a saturated link), and the whole "
            "job runs at its pace."
            '{{ else if eq $labels.cause "link" }}'
            f"{WHERE.capitalize()}'s round trips to the c10d store take "
            '{{ $value | printf "%.0f" }}x the run\'s median while every rank waits on '
            "communication: the network link of its node is slow (a degraded NIC or cable, "
            "or a saturated link), and the whole job runs at its pace."
            "{{ else }}"
            f'{WHERE.capitalize()} spends {{{{ $value | printf "%.2f" }}}}x the run\'s median '
            "{{ $labels.cause }} time per step. Its peers wait for it inside the gradient "
            "allreduce, so they, not it, show long collective latency.{{ end }}"
        ),
        "In DDP every step ends in an allreduce, so the slowest rank sets the pace. The slow "
        "rank is the one with more compute (cause=compute) or data-loading (cause=data) time "
        "per step than the median rank (in a run of two ranks, than the faster one: the "
        "median of two is their mean). Its collective latency is the SHORTEST: the healthy "
        "ranks wait for it inside the allreduce, so never blame by collective latency. A rank "
        "whose compute and data time together fall short of another rank's by "
        f"{cfg.straggler_ratio:g}x and {cfg.straggler_min_excess_seconds * 1000:g} ms reaches "
        "the allreduce first and waits for that rank like its peers: it is not named, however "
        "slow its own compute. A rank is judged once its phase times have been recorded for "
        f"half of the {cfg.rate_window} rate window: at a job's start, or after a pause longer "
        "than that window (a restarted attempt), the first rates rest on two scrapes of its "
        "first steps, which a busy host slows on one rank more than on another. A "
        "slow network link slows every rank alike, so no rank's compute stands out: "
        "cause=link names the ranks whose c10d-store round trips (one per heartbeat) take "
        f"over {cfg.link_rtt_ratio:g}x the run's median and over "
        f"{cfg.link_min_rtt_seconds * 1000:g} ms while over "
        f"{cfg.link_comm_share:.0%} of their step is exposed communication: their "
        "packets queue behind the gradients on that link. A slow link on the node that "
        "hosts the store inflates every other node's round trips instead, and not its own "
        "(the store is local): with three nodes or more, cause=link then names the ranks "
        f"whose round trip is {cfg.link_rtt_ratio:g}x below a run median over "
        f"{cfg.link_min_rtt_seconds * 1000:g} ms. It cannot name a slow link on half of the "
        "nodes or more, nor tell the two ends of a two-node job apart; `ddp-exporter doctor "
        "--links` can. A job on one node names no link: its ranks reach the store without a "
        "network, so a slow round trip there is CPU contention.",
        "Stragglers dashboard: phase split per rank (the straggler's compute or data bar is "
        "taller; the others' comm_wait is taller). Overview: straggler score per rank.",
        "cause=compute: check that GPU for thermal or power throttling, ECC errors, a "
        "co-located process, a slower device model, or uneven work (batch sizes). cause=data: "
        "check that host's CPU load, disk and network, and the DataLoader's num_workers. "
        "cause=link: run `ddp-exporter doctor --links` (between jobs, or on the suspect "
        "node and a healthy one), check the NIC's negotiated speed, errors and cable "
        "(`ethtool`, `ip -s link`), and other traffic on that node; drain it if it stays "
        "slow.",
    )


def input_bound(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPInputBound: a rank spends a large share of each step waiting for data."""
    r = recorded(cfg)
    return Alert(
        "DDPInputBound",
        "info",
        f'{r.phase_share}{{phase="data"}} > {cfg.input_bound_share:g}',
        cfg.input_bound_for,
        "A rank spends a large share of each step waiting for input data.",
        (
            f"{WHERE.capitalize()} spends {{{{ $value | humanizePercentage }}}} of each step "
            "waiting for the DataLoader."
        ),
        "The accelerator idles while the input pipeline catches up. If every rank shows it, "
        "the job is input-bound; if one does, that rank's host is (see DDPRankStraggler "
        "cause=data).",
        "Stragglers dashboard: the data share of the step per rank.",
        "Raise DataLoader num_workers and prefetch_factor, enable pin_memory, move decoding "
        "off the critical path, or cache/pre-shard the data set closer to the node.",
    )


def throughput_drop(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPThroughputDrop: the run's step rate fell well below its own recent past."""
    r, c = recorded(cfg), clauses(cfg)
    runs_total = selector(cfg, catalog.SECTION_RUNS.name)
    run, by_run = c.on("run"), c.by("run")
    return Alert(
        "DDPThroughputDrop",
        "warning",
        (
            f"({r.steps_rate_run} > 0)\n< {cfg.throughput_drop_ratio:g} * "
            f"avg_over_time({r.steps_rate_run}[{cfg.baseline_window}])\n"
            f"unless {run}\nmax {by_run} ({r.in_section})\n"
            # A section that just ended still weighs on the rate window.
            f"unless {run}\nmax {by_run} (changes({runs_total}[{cfg.rate_window}]) > 0)"
        ),
        cfg.throughput_for,
        "Training throughput fell well below its own recent past.",
        (
            'Steps/s of run {{ $labels.run }} is {{ $value | printf "%.3g" }}, below '
            f"{cfg.throughput_drop_ratio:.0%} of its average over the last "
            f"{cfg.baseline_window}."
        ),
        "The job still progresses but much slower than it did recently: a new straggler, "
        "input pipeline trouble, network degradation, or a change in the workload. DDP's "
        "ranks step together, so this is one alert for the run; a declared section "
        "(checkpoint, evaluation) that is running or just ended is not a drop.",
        "Overview dashboard: steps/s and step time per rank; Stragglers: which phase grew.",
        "Look for a concurrent DDPRankStraggler or DDPInputBound on the same run and follow "
        "it; otherwise compare the phase split before and after the drop.",
        scope="run",
    )


def gpu_memory_near_limit(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPGPUMemoryNearLimit: a rank's caching allocator holds nearly all the GPU."""
    r = recorded(cfg)
    return Alert(
        "DDPGPUMemoryNearLimit",
        "warning",
        f"{r.gpu_reserved_ratio} > {cfg.gpu_memory_ratio:g}",
        cfg.gpu_memory_for,
        "A rank's GPU memory is nearly exhausted.",
        (
            f"The caching allocator of {WHERE} holds {{{{ $value | humanizePercentage }}}} "
            "of the GPU's memory."
        ),
        "The next larger batch, a longer sequence or fragmentation can raise "
        "torch.OutOfMemoryError and kill the rank (and with it the job).",
        "Memory dashboard: allocated, reserved and peak against total per rank.",
        "Reduce the micro-batch size, enable activation checkpointing, set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation, or look "
        "for tensors kept alive across steps (a growing allocated line).",
    )
