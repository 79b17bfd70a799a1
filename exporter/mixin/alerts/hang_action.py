"""Build the hang action's alerts: a hung run aborted for a restart, and a restart loop.

With ``instrument(on_hang="abort")`` a hang ends every rank of the run for its launcher to
restart it (:mod:`exporter.hangs.action`); DDPHangAborted names the culprit. When aborts keep
coming without progress the action stops (:mod:`exporter.hangs.restarts`) and DDPRestartLoop
names every attempt's culprit. The exit codes, limits and delays the prose states are the
exporter's defaults (:mod:`exporter.settings`), read when the text is written.
"""

from __future__ import annotations

from ... import catalog, settings
from ...hangs.action import UNCERTAIN_FACTOR, ActionPolicy
from ..alert import Alert
from ..config import DEFAULT, MixinConfig
from ..prose import share, times
from .shared import aborted_runs, hang_location, looping_runs, printf_selector

__all__ = [
    "TORCH_TIMEOUT_MINUTES",
    "hang_aborted",
    "hang_action_alerts",
    "restart_loop",
    "restart_history",
]

#: PyTorch's default collective timeouts in minutes (NCCL, then gloo and the rest): how long a
#: hung run idles when nothing ends it.
TORCH_TIMEOUT_MINUTES: tuple[int, int] = (10, 30)


def hang_action_alerts(cfg: MixinConfig = DEFAULT) -> list[Alert]:
    """Return DDPHangAborted and DDPRestartLoop for ``cfg``."""
    return [hang_aborted(cfg), restart_loop(cfg)]


def restart_history(cfg: MixinConfig = DEFAULT) -> str:
    """Return a description suffix listing each aborted attempt's culprit rank and node.

    A template ``query`` reads ``ddp_hang_aborted_attempt_step`` of the alert's run (published
    by the monitoring rank from the run's ledger) over the restart-loop window, in attempt order
    (as text: attempt 10 sorts before 2).
    """
    metric = printf_selector(cfg, catalog.HANG_ABORTED_ATTEMPT.name, "run")
    query = (
        f"max by (attempt, culprit_rank, node) (last_over_time({metric}"
        f"[{cfg.restart_loop_window}]))"
    )
    return (
        f"{{{{ with printf `{query}` $labels.run | query | sortByLabel `attempt` }}}}"
        " Aborted attempts:"
        "{{ range . }} attempt {{ .Labels.attempt }}: "
        "{{ if .Labels.culprit_rank }}rank {{ .Labels.culprit_rank }} on node "
        "{{ .Labels.node }}{{ else }}every rank stuck{{ end }}, furthest step "
        "{{ .Value }};{{ end }}{{ end }}"
    )


def _when_it_acts() -> str:
    """Return when the action ends a run, in the settings' default numbers."""
    after = settings.DEFAULT_ABORT_AFTER_S
    policy = ActionPolicy()
    return (
        f"{after:g} s with complete evidence, {UNCERTAIN_FACTOR * after:g} s otherwise; at least "
        f"{times(policy.threshold_factor)} the threshold that declared it, at most "
        f"{share(policy.timeout_share)} the process group's timeout"
    )


def hang_aborted(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPHangAborted: the hang action ended a hung run for its launcher to restart."""
    low, high = TORCH_TIMEOUT_MINUTES
    return Alert(
        "DDPHangAborted",
        "warning",
        aborted_runs(cfg),
        "0s",
        "The hang action ended every rank of a hung run for its launcher to restart it.",
        (
            "Run {{ $labels.run }} was aborted on a hang: "
            "{{ if $labels.culprit_rank }}rank {{ $labels.culprit_rank }}"
            "{{ if $labels.node }} on node {{ $labels.node }}{{ end }} never entered the "
            "collective the others waited in."
            "{{ else }}every rank was stuck inside the same collective (no rank behind)."
            "{{ end }}"
            + hang_location(cfg, "culprit_rank", cfg.hang_abort_window)
            + " Every rank exited (ddp-exporter's exit code, "
            f"{settings.DEFAULT_ABORT_EXIT_CODE} by default) for the launcher "
            "to restart the job from its last checkpoint."
        ),
        'With `instrument(on_hang="abort")` (`DDP_EXPORTER_ON_HANG=abort`), once a hang\'s '
        "dumps are on disk and the hang has lasted `DDP_EXPORTER_ABORT_AFTER_S` "
        f"({_when_it_acts()}), every rank of the run publishes "
        "`ddp_hang_abort_timestamp_seconds{culprit_rank, node}` and "
        f"exits, instead of idling until the collective timeout ({low} to {high} minutes). The "
        "launcher (torchrun `--max-restarts`, Slurm requeue, Kubernetes) restarts the job "
        "from its last checkpoint; the alert fires for "
        f"{cfg.hang_abort_window} after the abort. A job that does not come back within "
        "that time raises DDPJobKilled.",
        "Collectives dashboard: the in-flight age that grew until the abort; Overview: the "
        "restarted attempt's steps (`ddp_rank_info{attempt}` one higher). The episode folder "
        "(`ddp-exporter hangs DUMP_DIR`) holds every rank's stack and the verdict, which "
        "records the action.",
        "Read the verdict: the culprit's file:line says where it was stuck (data loader, "
        "file system, a rank-dependent branch, a collective the others never call). If the "
        "same rank or node is the culprit again after the restart, drain that node "
        "(`<dump_dir>/<run>-abort.txt` names it for a requeue script). If the job hangs "
        "again at the same place, it is a bug in the training code: the restart cannot fix "
        "it, and after `DDP_EXPORTER_ABORT_LIMIT` aborts without progress DDPRestartLoop "
        "says so.",
        scope="run",
    )


def restart_loop(cfg: MixinConfig = DEFAULT) -> Alert:
    """Return DDPRestartLoop: aborts in a row without progress made the action stop."""
    return Alert(
        "DDPRestartLoop",
        "critical",
        looping_runs(cfg),
        "0s",
        "Restarting a hung run did not help: the hang action stopped.",
        (
            "Run {{ $labels.run }} was aborted on a hang {{ $value }} times in a row without "
            "getting past the furthest step of its earlier attempts. The last abort exited "
            f"with the give-up code ({settings.DEFAULT_GIVE_UP_EXIT_CODE} by default, do not "
            "requeue) and the hang action no "
            "longer ends the run: a next hang only alerts and dumps." + restart_history(cfg)
        ),
        'Each abort of `instrument(on_hang="abort")` restarts the job from its last '
        "checkpoint. When the culprit stays broken (the same node's file system or network, a "
        "data shard that never arrives, a bug at one step), every attempt hangs again at the "
        f"same place. After `DDP_EXPORTER_ABORT_LIMIT` ({settings.DEFAULT_ABORT_LIMIT}) aborts "
        "in a row whose attempts did not get `DDP_EXPORTER_ABORT_PROGRESS_STEPS` "
        f"({settings.DEFAULT_ABORT_PROGRESS_STEPS}) steps past the furthest earlier "
        "one, the last abort exits with `DDP_EXPORTER_GIVE_UP_EXIT_CODE` and the action "
        "stops, so that a requeue script and the launcher stop too, instead of paying the "
        "detection and the restart forever. Fires while the run's monitoring rank reports "
        f"the streak, and for {cfg.restart_loop_window} after its last report.",
        "Collectives dashboard: the Restarts and Aborted attempts panels (each aborted "
        "attempt's furthest step, culprit rank and node); `<dump_dir>/<run>-restarts.json` "
        "and `-abort.txt` next to the dumps; `ddp-exporter hangs DUMP_DIR` for each attempt's "
        "verdict.",
        "If the same node is the culprit in every attempt, drain it (Slurm `scontrol update "
        "NodeName=... State=DRAIN`, or requeue with `--exclude`; Kubernetes `kubectl cordon`) "
        "and resubmit. If the culprits differ but the file:line is the same, it is a bug or "
        "bad data at that step: fix it before resubmitting; a restart cannot.",
        scope="run",
    )
