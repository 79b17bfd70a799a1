"""Tell how the launcher hosts the job's c10d store, and leave that store fit for a restart.

torchrun's agent hosts the store the workers rendezvous through (``MASTER_ADDR:MASTER_PORT``,
``TORCHELASTIC_USE_AGENT_STORE=True``) with static rendezvous (``--master-addr/--master-port``,
always) and with c10d rendezvous (``--standalone``, ``--rdzv-backend c10d``) unless
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``. That store outlives an attempt, and a restarted
attempt's ``init_process_group`` writes its keys where the previous attempt's still are: gloo
reads a peer's pair addresses (NCCL its unique id) under ``default_pg/`` as soon as the key
exists, gets the dead attempt's, and fails with ``Connection refused`` or waits forever (torch
2.13: pytorch/pytorch#135712, #167288). With its own store per attempt (rank 0 hosts it, and it
dies with the attempt) nothing is left over.

The hang action ends an attempt on purpose, with every rank held until the monitoring rank lets
them go, so the monitoring rank deletes those keys first (:func:`forget_attempt`): everything
``init_process_group`` and its process groups wrote under ``default_pg/``, not the exporter's
own keys (per attempt already), not the agent's (its rendezvous), not other prefixes. No rank of
the next attempt exists yet, so no fresh key can be deleted. Listing a store's keys needs
``Store.list_keys`` (torch 2.10 and later); where it is missing and a restart would meet the
shared store, :func:`restart_blocker` says so and how to launch instead, and
``exporter.instrument(on_hang="abort")`` refuses to start.

Torch's private parts used, feature-detected: ``PrefixStore.underlying_store`` (unwrapping the
default group's store down to the TCPStore) and the ``default_pg`` prefix that
``init_process_group`` puts in front of every key of its groups.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import settings, storekeys

__all__ = [
    "INIT_PREFIX",
    "Launch",
    "forget_attempt",
    "job_store",
    "launch",
    "restart_blocker",
    "root_store",
]

#: Prefix ``init_process_group`` gives every key of the default group and of the groups made
#: from it (``torch.distributed.distributed_c10d``: ``PrefixStore("default_pg", store)``).
INIT_PREFIX = "default_pg/"
#: Fragment of every key the exporter writes (they are per attempt: never stale).
_OWN = f"/{storekeys.PREFIX}/"


@dataclass(frozen=True)
class Launch:
    """How the launcher started this rank, as far as its environment tells."""

    #: Started by torchrun (an elastic agent).
    torchrun: bool
    #: The agent hosts the workers' store, and it outlives each attempt.
    shared_store: bool
    #: Restarts torchrun may still make (None outside torchrun).
    restarts_left: int | None
    #: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` was set (c10d rendezvous then gives every
    #: attempt its own store; static rendezvous shares it all the same).
    share_disabled: bool

    @property
    def restarts_in_place(self) -> bool:
        """Say whether torchrun will restart this job's workers under the same store."""
        return self.shared_store and bool(self.restarts_left)


def launch(environ: Mapping[str, str] | None = None) -> Launch:
    """Return the launch form of this process, read from its environment."""
    env = os.environ if environ is None else environ
    return Launch(
        torchrun=settings.under_torchrun(env),
        shared_store=env.get(settings.TORCHELASTIC_USE_AGENT_STORE) == "True",
        restarts_left=settings.restarts_left(env),
        share_disabled=env.get(settings.TORCH_DISABLE_SHARE_RDZV_TCP_STORE, "0") == "1",
    )


def job_store() -> Any:
    """Return the store every rank of the default process group shares, None before it exists."""
    import torch.distributed as dist

    # Private torch API (2.4-2.14): the default group's store, under its prefixes.
    return dist.distributed_c10d._get_default_store() if dist.is_initialized() else None


def root_store(store: Any) -> Any:
    """Return the store under ``store``'s prefixes (the TCPStore the launcher hosts)."""
    seen = 0
    while hasattr(store, "underlying_store") and seen < 16:
        store = store.underlying_store
        seen += 1
    return store


def _stale_keys(root: Any) -> list[str]:
    return [
        k
        for k in root.list_keys()
        if k.startswith(INIT_PREFIX) and _OWN not in k and not k.startswith(storekeys.PREFIX)
    ]


def forget_attempt(store: Any) -> int:
    """Delete the keys this attempt's process groups wrote into ``store``; return how many.

    Call it only once no rank of the attempt will use its process groups again (every rank is
    leaving) and before any rank of the next attempt starts. Raises what the store raises.
    """
    root = root_store(store)
    stale = _stale_keys(root)
    for key in stale:
        root.delete_key(key)
    return len(stale)


def restart_blocker(launch: Launch, store: Any, torch_version: str) -> str | None:
    """Return why an abort could not end in a working restart (one line with the fix), or None.

    Only a restart under the shared store is at risk, and only where its keys cannot be listed
    (``Store.list_keys``, torch 2.10+) to clear them. ``store`` is the default group's store.
    """
    if not launch.restarts_in_place or store is None:
        return None
    root = root_store(store)
    try:
        if callable(getattr(root, "delete_key", None)):
            root.list_keys()
            return None
        reason = "this store cannot delete keys"
    except Exception as exc:  # noqa: BLE001 - AttributeError, or a store type without it
        reason = f"its keys cannot be listed ({type(exc).__name__})"
    fix = (
        "launch with --rdzv-backend c10d --rdzv-endpoint HOST:PORT and "
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (static --master-addr/--master-port rendezvous "
        "always shares it)"
    )
    return (
        f"torchrun shares its agent's c10d store with the workers (restarts left: "
        f"{launch.restarts_left}) and, with torch {torch_version}, {reason} to clear the "
        f"aborted attempt's, so the restarted job would read them and fail to connect; {fix}, "
        "or use torch 2.10 or later"
    )
