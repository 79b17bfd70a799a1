"""Build the GPU alerts: a straggler whose own GPU is throttled, and a GPU that reports errors.

A GPU runs slower when its clocks are held down: by its hardware (thermal or power-brake
slowdown), by the driver (thermal, power cap), or by a clock an operator set. Throttling alone
costs the job nothing while the rank keeps pace, and a power cap on every GPU of a run slows
every rank alike: neither names a rank. The straggler by compute whose SM clock runs well below
the run's median, or whose GPU alone holds a slowdown reason, has its cause named instead
(DDPGPUThrottledStraggler, which silences DDPRankStraggler cause=compute for that rank in the
generated Alertmanager configuration). An Xid event, an uncorrectable ECC error or a failed row
remap is a hardware fault whatever the job's pace (DDPGPUError), and counts against the node in
the fleet's blame.
"""

from __future__ import annotations

from ... import catalog
from ..alert import Alert, selector
from ..cluster import clauses
from ..config import DEFAULT, MixinConfig
from .shared import WHERE, compute_straggler, printf_selector

__all__ = ["SLOWDOWN_REASONS", "gpu_alerts", "gpu_error", "gpu_throttled_straggler"]

#: Clock-event reasons that slow a GPU down (the others: idle, sync boost, settings).
SLOWDOWN_REASONS: tuple[str, ...] = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sw_power_cap",
)


def gpu_alerts(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return DDPGPUThrottledStraggler and DDPGPUError."""
    return [gpu_throttled_straggler(cfg), gpu_error(cfg)]


def _with_gpu(cfg: MixinConfig, expr: str) -> str:
    """Return ``expr`` (by run and rank) with the rank's node and its GPU's index and UUID."""
    c = clauses(cfg)
    gpu = selector(cfg, catalog.GPU_INFO.name)
    info = selector(cfg, catalog.RANK_INFO.name)
    return (
        f"(\n{expr}\n)\n* {c.on('run, rank')} group_left (gpu_index, gpu_uuid)\n"
        f"max {c.by('run, rank, gpu_index, gpu_uuid')} ({gpu})\n"
        f"* {c.on('run, rank')} group_left (node)\nmax {c.by('run, rank, node')} ({info})"
    )


def _throttled_expr(cfg: MixinConfig) -> str:
    c = clauses(cfg)
    clock = selector(cfg, catalog.GPU_SM_CLOCK.name)
    events = selector(cfg, catalog.GPU_CLOCK_EVENT.name, f'reason=~"{"|".join(SLOWDOWN_REASONS)}"')
    ratio = f"({clock}\n / {c.on('run')} group_left\n quantile {c.by('run')} (0.5, {clock}))"
    active = f"({events} == 1)"
    # A reason that holds on half of the run's GPUs or more slows every rank alike.
    lone = (
        f"({active}\n unless {c.on('run, reason')}\n"
        f" (count {c.by('run, reason')} {active} * 2\n"
        f"  >= {c.on('run')} group_left\n  count {c.by('run')} ({clock})))"
    )
    # One alert per reason: each lone slowdown reason, else a clock well below the run's.
    throttled = (
        f"max {c.by('run, rank, reason')} (\n  (\n"
        f"    {lone} * 0\n    + {c.on('run, rank')} group_left ()\n    {ratio}\n"
        f"    or\n    (\n      label_replace({ratio} < {cfg.gpu_clock_ratio:g},"
        ' "reason", "low_clock", "", "")\n'
        f"      unless {c.on('run, rank')} {lone}\n    )\n  )\n"
        f"  and {c.on('run, rank')}\n  ({compute_straggler(cfg)})\n)"
    )
    return _with_gpu(cfg, throttled)


def _clock_of(cfg: MixinConfig, what: str) -> str:
    """Return a template reading the rank's SM clock (``rank``) or the run's median (``run``)."""
    if what == "rank":
        metric = printf_selector(cfg, catalog.GPU_SM_CLOCK.name, "run", "rank")
        args = "$labels.run $labels.rank"
    else:
        metric = f"quantile(0.5, {printf_selector(cfg, catalog.GPU_SM_CLOCK.name, 'run')})"
        args = "$labels.run"
    return (
        f"{{{{ with printf `{metric}` {args} | query }}}}{{{{ with first . }}}}"
        "{{ .Value | humanize }}Hz{{ end }}{{ end }}"
    )


def gpu_throttled_straggler(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPGPUThrottledStraggler: the straggler by compute runs on a throttled GPU."""
    return Alert(
        "DDPGPUThrottledStraggler",
        "warning",
        _throttled_expr(cfg),
        cfg.straggler_for,
        "A straggler's own GPU is throttled: its clocks are held down.",
        (
            f"{WHERE.capitalize()} on node {{{{ $labels.node }}}} computes over "
            f"{cfg.straggler_ratio:g}x the run's median per step, and its GPU "
            "{{ $labels.gpu_index }} ({{ $labels.gpu_uuid }}) is throttled: "
            '{{ if eq $labels.reason "low_clock" }}its clocks are down'
            "{{ else }}{{ $labels.reason }}{{ end }}, SM "
            f"{_clock_of(cfg, 'rank')} vs the run's median {_clock_of(cfg, 'run')}."
        ),
        "The straggler named by DDPRankStraggler cause=compute has its cause on the GPU: its "
        f"SM clock runs below {cfg.gpu_clock_ratio:.0%} of the run's median "
        "(reason=low_clock), or it alone (fewer than half of the run's GPUs) holds one of "
        f"NVML's slowdown reasons ({', '.join(SLOWDOWN_REASONS)}). Hardware and thermal "
        "slowdowns come from cooling, a power supply or a failing board; a power cap from a "
        "lowered limit. A throttled GPU that keeps pace, or the same cap on every GPU, pages "
        "nobody. Needs the gpu extra on the ranks (ddp_rank_gpu_info).",
        "Memory dashboard: GPU SM clock per rank and GPU slowdown reasons; on the node, "
        "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i <gpu_uuid>`: the clock-event "
        "reasons and how long each held.",
        "Check the node's cooling (fans, inlet temperature) and power (PSU, power brake "
        "events in the BMC's log), and whether someone lowered the power limit (`nvidia-smi "
        "-q -d POWER`). Drain the node if the slowdown is in hardware; move the job meanwhile.",
    )


def _error_expr(cfg: MixinConfig) -> str:
    c = clauses(cfg)
    w = cfg.gpu_error_window
    xids = selector(cfg, catalog.GPU_XID_ERRORS.name)
    last = selector(cfg, catalog.GPU_LAST_XID.name)
    ecc = selector(
        cfg, catalog.GPU_ECC_ERRORS.name, 'error_type="uncorrected"', 'counter="volatile"'
    )
    failed = selector(cfg, catalog.GPU_REMAPPED_ROWS.name, 'kind="failure"')
    errors = (
        f"max {c.by('run, rank, cause, xid')} (\n"
        f"  label_replace(\n    max {c.by('run, rank, xid')} (last_over_time({last}[{w}]))\n"
        f"    and {c.on('run, rank')} (increase({xids}[{w}]) > 0),\n"
        '    "cause", "xid", "", ""\n  ) * 0 + 1\n  or\n'
        f'  label_replace(increase({ecc}[{w}]) > 0, "cause", "ecc", "", "")\n  or\n'
        f'  label_replace(max_over_time({failed}[{w}]) > 0, "cause", "row_remap", "", "")\n)'
    )
    return _with_gpu(cfg, errors)


def gpu_error(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPGPUError: a rank's GPU reported an Xid, an uncorrectable ECC error or a failed remap."""
    return Alert(
        "DDPGPUError",
        "critical",
        _error_expr(cfg),
        "0s",
        "A rank's GPU reported a hardware error.",
        (
            f"The GPU {{{{ $labels.gpu_index }}}} ({{{{ $labels.gpu_uuid }}}}) of {WHERE} on "
            'node {{ $labels.node }} {{ if eq $labels.cause "xid" }}raised Xid '
            '{{ $labels.xid }}{{ else if eq $labels.cause "ecc" }}had uncorrectable ECC '
            "errors ({{ $value }} within the last "
            f"{cfg.gpu_error_window}){{{{ else }}}}failed to remap a memory row{{{{ end }}}}."
        ),
        "Xid events are the driver's critical errors (fallen off the bus, a double-bit ECC "
        "error, a GPU reset, an NVLink or GSP fault; also a kernel's illegal memory access, "
        "which is the job's own). An uncorrectable ECC error corrupts data the job holds; a "
        "failed row remap means the memory has no spare rows left. Each fires at once and "
        f"stays {cfg.gpu_error_window}, and counts against the node in the fleet's blame "
        "(DDPSuspectNode, `ddp-exporter nodes`).",
        "`nvidia-smi -q -d ECC,ROW_REMAPPER -i <gpu_uuid>` and the kernel log (`dmesg | grep "
        "-i xid`) on the node; NVIDIA's Xid catalogue for the number.",
        "An Xid the job caused (13, 31, 43: its own kernel faulted) is fixed in the code. "
        "Otherwise drain the node: a GPU reset clears a pending remap, a board with failed "
        "remaps or repeated uncorrectable errors goes back to the vendor. Restart the job "
        "from its last checkpoint elsewhere: its state may be corrupt.",
    )
