"""Hold every variable of the exporter in one table: what it accepts, its default, what it means.

Rendered as the settings reference page; :func:`~exporter.settings.validate.resolve` reads it.
"""

from __future__ import annotations

from .kinds import (
    EXIT_CODE,
    Setting,
    bind,
    boolean,
    deadline,
    host,
    integer,
    lower,
    name_text,
    node,
    one_of,
    parse_attempt,
    parse_fake_versions,
    parse_float,
    parse_int,
    parse_switch,
    path,
    same,
    seconds,
)
from .names import (
    ABORT_AFTER_S,
    ABORT_EXIT_CODE,
    ABORT_LIMIT,
    ABORT_PROGRESS_STEPS,
    ADDR,
    ADVERTISE_ADDR,
    ALERTMANAGER_BINARY,
    ATTEMPT,
    AUTORUN,
    COMM_TIMING,
    COMM_TIMING_CHOICES,
    DEFAULT_ABORT_AFTER_S,
    DEFAULT_ABORT_EXIT_CODE,
    DEFAULT_ABORT_LIMIT,
    DEFAULT_ABORT_PROGRESS_STEPS,
    DEFAULT_ADDR,
    DEFAULT_DEVICE_WAIT_EVERY,
    DEFAULT_DUMP_DIR,
    DEFAULT_FINAL_SCRAPE_S,
    DEFAULT_GIVE_UP_EXIT_CODE,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_PEER_SERIES,
    DEFAULT_PORT,
    DEVICE_WAIT_EVERY,
    DOCTOR_FAKE_VERSIONS,
    DUMP_DIR,
    FILE_SD,
    FINAL_SCRAPE_S,
    FLIGHT_RECORDER,
    GIVE_UP_EXIT_CODE,
    GLOO_SOCKET_IFNAME,
    GPU_HEALTH,
    GRAFANA_BINARY,
    HANG_PROBE,
    HEARTBEAT_S,
    JOB_DEADLINE,
    LOCAL_RANK,
    MASTER_ADDR,
    MASTER_PORT,
    MAX_HEARTBEAT_S,
    MONITOR_RANK,
    NCCL_SOCKET_IFNAME,
    NODE,
    ON_HANG,
    ON_HANG_CHOICES,
    OTEL_ENDPOINT,
    OTEL_METRIC_EXPORT_INTERVAL,
    OTEL_METRIC_EXPORT_TIMEOUT,
    OTEL_METRICS_ENDPOINT,
    OTEL_SDK_DISABLED,
    PEER_SERIES,
    PORT,
    PROMETHEUS_BINARY,
    RANK,
    RUN,
    SLURM_JOB_END_TIME,
    SLURM_JOB_ID,
    SLURM_RESTART_COUNT,
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE,
    TORCHELASTIC_MAX_RESTARTS,
    TORCHELASTIC_RESTART_COUNT,
    TORCHELASTIC_RUN_ID,
    TORCHELASTIC_USE_AGENT_STORE,
    VERSION_KEYS,
    WEB_CONFIG,
    WORLD_SIZE,
)

#: Every variable of the exporter (and the deadline Slurm sets), by name: one validator reads
#: them all. Launcher variables (RANK, MASTER_PORT, ...) are torch's: a bad one stops torch first.
SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            PORT,
            "an int in 0..65535 (0: a free port)",
            DEFAULT_PORT,
            parse_int,
            integer(0, 65535),
            "port",
            meaning="Base port of the metrics endpoint: each rank serves ``/metrics`` on "
            "``port + LOCAL_RANK`` (the default lies outside the 9100-9999 range that "
            "Prometheus exporters share). ``0`` picks a free port; ``Observer.port`` says which.",
        ),
        Setting(
            ADDR,
            "a bind address (an IP address or host name)",
            DEFAULT_ADDR,
            str.strip,
            bind,
            "addr",
            meaning="Bind address of the metrics endpoint; ``127.0.0.1`` keeps it on the node.",
        ),
        Setting(
            WEB_CONFIG,
            "a file path",
            None,
            str.strip,
            path,
            "web_config",
            "none (plain HTTP)",
            meaning="A web configuration file in the format of Prometheus's exporter-toolkit "
            "(``tls_server_config``, ``basic_auth_users``), applied to every path a rank "
            "serves: TLS, client certificates, basic authentication. Re-read when it or a "
            "file it names changes. A file that cannot be served as written is logged in "
            "one line naming the field, and nothing is served until it is fixed (never in the "
            "clear) while training goes on. Needs the ``web`` extra.",
        ),
        Setting(
            RUN,
            "a run name (not blank)",
            None,
            str.strip,
            name_text,
            "run",
            "torchrun's run id, Slurm's job id or MASTER_ADDR:MASTER_PORT",
            meaning="The ``run`` label, which keeps concurrent jobs apart. Unset: torchrun's "
            "``TORCHELASTIC_RUN_ID`` (ignored when it is torchrun's placeholder ``none``), "
            "then Slurm's ``SLURM_JOB_ID``, then ``MASTER_ADDR:MASTER_PORT`` (the same on "
            "every rank of a job, distinct between concurrent jobs), then ``local``. An "
            "explicit rendezvous id (``torchrun --rdzv-id``) thus wins over the Slurm job "
            "id: pass ``--rdzv-id $SLURM_JOB_ID`` to get the same value either way. A "
            "restarted or requeued job keeps its run; ``ddp_rank_info{attempt}`` tells the "
            "attempts apart.",
        ),
        Setting(
            HEARTBEAT_S,
            f"seconds in 0..{MAX_HEARTBEAT_S:g} (0: off)",
            DEFAULT_HEARTBEAT_S,
            parse_float,
            seconds(0, inclusive=True, maximum=MAX_HEARTBEAT_S),
            "heartbeat_s",
            meaning="Seconds between a rank's c10d-store heartbeats: liveness (peer "
            "heartbeat ages), the store round trip that names a slow link, the hang "
            "watcher's reports and the init watch's check-in. ``0`` turns them off.",
        ),
        Setting(
            MONITOR_RANK,
            "a rank >= -1 (-1: none)",
            0,
            parse_int,
            integer(-1),
            "monitor_rank",
            meaning="The rank that reads every peer's heartbeat and publishes its age, "
            "serves ``/sd`` (the job's targets for Prometheus) and watches for hangs. "
            "``-1``: none.",
        ),
        Setting(
            PEER_SERIES,
            "an int >= 0",
            DEFAULT_PEER_SERIES,
            parse_int,
            integer(0),
            "peer_series",
            meaning="Most peer-heartbeat (and init check-in) series the monitoring rank "
            "publishes: every peer in jobs of up to this many ranks, beyond that only late "
            "peers, oldest first. ``0``: none.",
        ),
        Setting(
            FLIGHT_RECORDER,
            "1 or 0 (true/false, yes/no, on/off)",
            True,
            parse_switch,
            boolean,
            "flight_recorder",
            "1",
            meaning="Read in-flight collective state from torch's Flight Recorder (every "
            "collective of every process group). ``0``: the comm hook's own bookkeeping only "
            "(DDP's gradient buckets).",
            keyword_accepted="True or False",
        ),
        Setting(
            COMM_TIMING,
            "one of 'auto', 'reducer', 'events', 'hook'",
            "auto",
            lower,
            one_of(COMM_TIMING_CHOICES),
            "comm_timing",
            meaning="How a DDP model's communication is timed. ``reducer``: DDP's own "
            "reducer timers (CPU only). ``events``: three marks per iteration (CUDA events "
            "on a GPU), nothing per gradient bucket. Both leave DDP's built-in allreduce "
            "untouched. ``hook``: a timing comm hook, per-bucket detail, a Python call per "
            "bucket. ``auto``: ``reducer`` on CPU where steps close at the optimizer or the "
            "DataLoader, else ``events``; ``hook`` where no Flight Recorder gives the "
            "in-flight state. Without DDP every ``torch.distributed`` collective is timed "
            "where it is called, whatever this says.",
        ),
        Setting(
            DUMP_DIR,
            "a folder path",
            DEFAULT_DUMP_DIR,
            str.strip,
            path,
            "dump_dir",
            meaning="Folder for hang dumps, relative to each rank's working directory: one "
            "subfolder per hang episode, one JSON and one text file per rank, folders 0700 "
            "and files 0600. Checked at start: created, or one log line says where dumps "
            "go instead.",
        ),
        Setting(
            ADVERTISE_ADDR,
            "a host name or IP address without port or scheme (the port is the metrics port)",
            None,
            str.strip,
            host,
            "",
            "the address of the interface that reaches MASTER_ADDR",
            meaning="Host or IP registered for discovery (``/sd``, file_sd): where "
            "Prometheus scrapes this rank. Unset: the bind address when it names one "
            "interface; when bound to every interface, the IP of the interface that routes "
            "to ``MASTER_ADDR``, else the hostname's address, else the default route's "
            "interface IP (never a loopback address), else the hostname.",
        ),
        Setting(
            FILE_SD,
            "a folder path",
            None,
            str.strip,
            path,
            "",
            "unset: no file_sd",
            meaning="Folder where each rank writes its own file_sd target file "
            "(atomically), for Prometheus' ``file_sd_configs``; removed at a clean exit, "
            "kept when the rank dies.",
        ),
        Setting(
            JOB_DEADLINE,
            "a Unix time or a duration like 72h, 90m, 3600s or 1d12h",
            None,
            deadline(JOB_DEADLINE),
            same,
            "",
            "none (SLURM_JOB_END_TIME, else no deadline)",
            meaning="The job's wall-clock limit: a Unix time, or a duration from the job's "
            "start (torchrun's start under torchrun, so restarted workers keep it; else the "
            "rank's process start). With the steps to run (``instrument(total_steps=...)`` "
            "or ``epochs``) the rules project whether the job finishes in time "
            "(DDPJobWillMissDeadline). Wins over ``SLURM_JOB_END_TIME``.",
        ),
        Setting(
            SLURM_JOB_END_TIME,
            "a Unix time (seconds since 1970)",
            None,
            deadline(SLURM_JOB_END_TIME),
            same,
            "",
            "none (no deadline)",
            meaning="Set by Slurm 23.02 and later: the Unix time the job's ``--time`` limit "
            "ends it. ``0`` or empty: no deadline.",
        ),
        Setting(
            FINAL_SCRAPE_S,
            "seconds >= 0 (0: no wait)",
            DEFAULT_FINAL_SCRAPE_S,
            parse_float,
            seconds(0, inclusive=True),
            meaning="Most seconds a rank that ends cleanly (or leaves on a hang action) "
            "waits for its scrapers to read its final state, so that a finished job is not "
            "taken for a dead one. ``0``: no wait.",
        ),
        Setting(
            ON_HANG,
            "'off' or 'abort'",
            "off",
            lower,
            one_of(ON_HANG_CHOICES),
            "on_hang",
            meaning="What a hang does besides alerts and dumps. ``abort``: every rank of "
            "the run exits with the abort exit code once the hang has lasted "
            "``DDP_EXPORTER_ABORT_AFTER_S``, for the launcher to restart the job from its "
            "last checkpoint.",
        ),
        Setting(
            HANG_PROBE,
            "1 or 0 (true/false, yes/no, on/off)",
            True,
            parse_switch,
            boolean,
            "",
            "1",
            meaning="While every rank waits inside the same collective with nobody behind, "
            "test the links between the nodes from inside the job: every rank listens on a "
            "side port at its backend's address, one rank per node tries the others, and "
            "the hang's verdict names the link or the node that carries no traffic (or says "
            "it is not the network). ``0``: no listener, no probe.",
        ),
        Setting(
            GPU_HEALTH,
            "1 or 0 (true/false, yes/no, on/off)",
            True,
            parse_switch,
            boolean,
            "",
            "1",
            meaning="On a CUDA rank, read its GPU's health through NVML (the ``gpu`` extra, "
            "``nvidia-ml-py``) at each scrape: clocks, clock-event (throttle) reasons, "
            "temperature, power, ECC errors, row remapping, PCIe replays, NVLink errors, "
            "and Xid events on a background thread. ``0``: none of it, no NVML call.",
        ),
        Setting(
            DEVICE_WAIT_EVERY,
            "an int >= 0",
            DEFAULT_DEVICE_WAIT_EVERY,
            parse_int,
            integer(0),
            "",
            str(DEFAULT_DEVICE_WAIT_EVERY),
            meaning="On a CUDA rank, time on the device how long the compute stream waits "
            "for collectives other than DDP's own (FSDP2's, tensor parallelism's, a loop's, "
            "a DDP step's logged loss or SyncBatchNorm; two CUDA events per wait, resolved off "
            "the training thread) in one step of every this many, and count that step's waits "
            "this many times in comm_wait. ``1``: every step. ``0``: none; those waits then "
            "count as compute.",
        ),
        Setting(
            ABORT_AFTER_S,
            "seconds > 0",
            DEFAULT_ABORT_AFTER_S,
            parse_float,
            seconds(0, inclusive=False),
            "abort_after",
            meaning="Seconds a hang whose evidence is complete lasts before ``abort`` acts; "
            "1.5x as long when it is not, at least twice the threshold that declared the "
            "hang, at most half the process group's timeout.",
        ),
        Setting(
            ABORT_EXIT_CODE,
            EXIT_CODE,
            DEFAULT_ABORT_EXIT_CODE,
            parse_int,
            integer(1, 255),
            meaning="Exit code of every rank the hang action ends (EX_TEMPFAIL: try again).",
        ),
        Setting(
            ABORT_LIMIT,
            "an int >= 0 (0: never stop)",
            DEFAULT_ABORT_LIMIT,
            parse_int,
            integer(0),
            "abort_limit",
            meaning="Aborts in a row without progress after which the hang action stops: "
            "the last one exits with the give-up code, later hangs only alert and dump. "
            "``0``: never stop.",
        ),
        Setting(
            ABORT_PROGRESS_STEPS,
            "steps >= 1",
            DEFAULT_ABORT_PROGRESS_STEPS,
            parse_int,
            integer(1),
            meaning="Steps an attempt must get past the furthest step of the run's earlier "
            "attempts to count as progress.",
        ),
        Setting(
            GIVE_UP_EXIT_CODE,
            EXIT_CODE,
            DEFAULT_GIVE_UP_EXIT_CODE,
            parse_int,
            integer(1, 255),
            meaning='Exit code of the abort that reaches the limit: "do not requeue" '
            "(EX_UNAVAILABLE). Must differ from the abort exit code.",
        ),
        Setting(
            ATTEMPT,
            "a count of earlier attempts (0, 1, ...)",
            0,
            parse_attempt,
            meaning="Attempts of the run before this job, for a script that resubmits a run "
            "as a new job; added to torchrun's restart count (``TORCHELASTIC_RESTART_COUNT``) "
            "or Slurm's requeue count (``SLURM_RESTART_COUNT``) to make "
            "``ddp_rank_info{attempt}``.",
        ),
        Setting(
            NODE,
            "a node name (letters, digits, '.', '_', '-'; up to 253)",
            None,
            str.strip,
            node,
            "",
            "the hostname",
            meaning="The ``node`` label: the machine this rank runs on, what the fleet "
            "rules blame and a drain acts on. On Kubernetes, the node name (downward API "
            "``spec.nodeName``; the generated manifests set it), not the pod's hostname.",
        ),
        Setting(
            AUTORUN,
            "1 or 0 (true/false, yes/no, on/off)",
            False,
            parse_switch,
            boolean,
            "",
            "0",
            meaning="Set by ``ddp-exporter run`` for the command it runs: each rank is "
            "instrumented at its first ``optimizer.step()`` with the model and optimizer the "
            "script made, no line of it edited (the ``sitecustomize`` that ``run`` puts first "
            "on ``PYTHONPATH`` reads it). Any other setting applies as with ``instrument()``.",
        ),
        Setting(
            PROMETHEUS_BINARY,
            "a path to the prometheus executable",
            None,
            str.strip,
            path,
            "",
            "PATH, then /usr/local/bin, /opt/prometheus*/, ~/.local/bin, ~/prometheus-*/",
            meaning="The ``prometheus`` that ``ddp-exporter run`` and the demo start for their "
            "own alerts, where it is not on ``PATH`` (an official release unpacked anywhere).",
        ),
        Setting(
            ALERTMANAGER_BINARY,
            "a path to the alertmanager executable",
            None,
            str.strip,
            path,
            "",
            "PATH (prometheus-alertmanager, alertmanager), then /usr/local/bin, "
            "/opt/alertmanager*/, ~/.local/bin, ~/alertmanager-*/",
            meaning="The ``alertmanager`` that ``ddp-exporter run`` and the demo start, where it "
            "is not on ``PATH``.",
        ),
        Setting(
            GRAFANA_BINARY,
            "a path to the grafana (or grafana-server) executable",
            None,
            str.strip,
            path,
            "",
            "PATH (grafana, grafana-server), then /usr/sbin, /usr/share/grafana/bin, "
            "/opt/grafana*/bin, ~/grafana-*/bin",
            meaning="The Grafana that ``ddp-exporter run`` starts with the dashboards "
            "provisioned over its own Prometheus, where it is not on ``PATH``. Without one, "
            "``run`` starts none.",
        ),
        Setting(
            DOCTOR_FAKE_VERSIONS,
            "comma-separated KEY=VERSION with KEY in " + ", ".join(VERSION_KEYS),
            {},
            parse_fake_versions,
            same,
            "",
            "none",
            meaning="For tests only, never in production: versions this rank's ``ddp-exporter "
            "doctor`` reports instead of its real ones, to inject version skew "
            "(e.g. ``torch=9.9.9``).",
        ),
    )
}


#: Variables the exporter reads but does not own, and what it reads them for.
OTHER_VARIABLES: dict[str, str] = {
    OTEL_ENDPOINT: "OpenTelemetry's endpoint: when set (or its metrics-only form), each rank "
    "also pushes its series over OTLP/HTTP (extra ``otlp``).",
    OTEL_METRICS_ENDPOINT: "OpenTelemetry's metrics-only endpoint; as above.",
    OTEL_METRIC_EXPORT_INTERVAL: "Milliseconds between OTLP pushes (the SDK's own variable).",
    OTEL_METRIC_EXPORT_TIMEOUT: "Milliseconds an OTLP push may take (the SDK's own variable).",
    OTEL_SDK_DISABLED: "``true`` switches the OTLP push off.",
    RANK: "Set by the launcher; the rank until the process group exists.",
    LOCAL_RANK: "Set by the launcher; the endpoint's port is the base port plus it.",
    WORLD_SIZE: "Set by the launcher; the world size until the process group exists.",
    MASTER_ADDR: "Set by the launcher; the init watch and the doctor probe it, the advertised "
    "address is the interface that routes to it.",
    MASTER_PORT: "Set by the launcher; probed by the init watch and the doctor.",
    TORCHELASTIC_RUN_ID: "Set by torchrun: the default ``run`` label.",
    TORCHELASTIC_RESTART_COUNT: "Set by torchrun: the attempt of a restarted job.",
    TORCHELASTIC_MAX_RESTARTS: "Set by torchrun: whether a hang action's abort can be restarted.",
    TORCHELASTIC_USE_AGENT_STORE: "Set by torchrun: the init watch checks in through its "
    "agent's store.",
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE: "Read by torchrun's c10d rendezvous: ``1`` gives each "
    "attempt a store of its own (the doctor's ``restart`` check reads it).",
    SLURM_JOB_ID: "Set by Slurm: the ``run`` label when torchrun gives none.",
    SLURM_RESTART_COUNT: "Set by Slurm: the attempt of a requeued job.",
    GLOO_SOCKET_IFNAME: "Read by gloo: the doctor checks the interface exists and is reachable.",
    NCCL_SOCKET_IFNAME: "Read by NCCL: the doctor checks the interface exists.",
}
