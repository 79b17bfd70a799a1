"""Time DDP gradient-bucket collectives by wrapping the comm hook.

The wrapper keeps DDP's ``(state, bucket) -> Future[Tensor]`` contract and calls the user's
hook (compression, PowerSGD, ...) underneath, so their communication is unchanged. With no
user hook it stands in for DDP's built-in allreduce with the same arithmetic: DDP multiplies
each gradient by ``1/world_size`` before summing, and so does :func:`allreduce_mean_hook`
(torch's Python ``allreduce_hook`` divides afterwards, which differs in the last bits).
"""

# No `from __future__ import annotations`: DDP compares hook annotations to real types.
import functools
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..background import BackgroundLoop
from ..errors import ErrorCounter
from ..log import log
from .recorder import CollectiveStats, Recorder

__all__ = ["allreduce_mean_hook", "CommHookInstrumentor", "CommHookWrapper", "CudaEventResolver"]

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future]
#: A bucket's CUDA timing on the training path: (start event, the last bucket's launch event or
#: None, device). Quoted: the type checker reads them, run time leaves them be.
CudaStart = tuple["torch.cuda.Event", "torch.cuda.Event | None", "torch.device"]
#: What the resolver queues: (stats, t0, start event, end event, launch event or None).
CudaPair = tuple[
    CollectiveStats, float, "torch.cuda.Event", "torch.cuda.Event", "torch.cuda.Event | None"
]
#: What runs once a bucket's future completes: ``_done(t0, is_last, events, fut)``.
Done = Callable[[float, bool, CudaStart | None, torch.futures.Future], None]


def allreduce_mean_hook(
    process_group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average a bucket across ranks exactly like DDP's built-in reduction."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    size = group.size()
    if size > 1:  # x * 1.0 == x exactly: skip a pass over the bucket on one rank
        buffer.mul_(1.0 / size)
    fut = dist.all_reduce(buffer, group=group, async_op=True).get_future()
    return fut.then(_first_tensor)


def _first_tensor(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


def _record_then(
    done: Done, t0: float, is_last: bool, events: CudaStart | None, fut: torch.futures.Future
) -> torch.Tensor:
    # `done` never raises; fut.value() re-raises a failed collective exactly as DDP would see it.
    done(t0, is_last, events, fut)
    return fut.value()


class CudaEventResolver:
    """Resolve CUDA-event pairs into durations on a background thread, never on the training path.

    An NCCL future's callbacks run when the work is enqueued, not when it finishes, so the
    end of a collective is an event recorded on the collective's stream; ``Event.query()`` (no
    synchronisation) tells when both ends have happened.
    """

    def __init__(self, recorder: Recorder, errors: ErrorCounter, interval_s: float = 0.05):
        self._recorder = recorder
        self._pending: deque[CudaPair] = deque(maxlen=65536)
        self._loop = BackgroundLoop(
            "ddp-exporter-cuda", self.drain, interval_s, errors=errors, where="comm_hook"
        ).start()

    def submit(self, item: CudaPair) -> None:
        """Queue ``(stats, t0, start_event, end_event, launch_event_or_None)``."""
        self._pending.append(item)

    def drain(self) -> None:
        """Resolve every queued pair whose events have completed, in order."""
        while self._pending:
            stats, t0, start, end, launch = self._pending[0]
            # With the events' GPU current on this thread: a CUDA call on a thread whose device
            # was never set makes a context on GPU 0, hundreds of MiB there for every rank.
            with torch.cuda.device(end.device):
                if not end.query():
                    return
                self._pending.popleft()
                self._recorder.bucket_timed(stats, t0, start.elapsed_time(end) / 1000.0)
                if launch is not None:
                    self._recorder.add_comm_wait(launch.elapsed_time(end) / 1000.0)

    def close(self) -> None:
        """Stop the thread."""
        self._loop.close()


class CommHookWrapper:
    """Wrap a DDP comm hook: time each bucket, count its bytes, then call the inner hook.

    ``inner`` and ``inner_state`` can be swapped later (a hook the user registers after
    ``instrument``). ``enabled = False`` makes the wrapper a plain pass-through.
    """

    def __init__(
        self,
        recorder: Recorder,
        errors: ErrorCounter,
        stats: CollectiveStats,
        inner: Hook = allreduce_mean_hook,
        inner_state: Any = None,
        cuda: "CudaEventResolver | None" = None,
    ) -> None:
        self.recorder = recorder
        self.errors = errors
        self.stats = stats
        self.inner = inner
        self.inner_state = inner_state
        self.cuda = cuda
        self.enabled = True
        self.__name__ = "ddp_exporter_wrapper"
        self.set_inner(inner, inner_state)

    def set_inner(self, hook: Hook, state: Any) -> None:
        """Put the user's hook underneath."""
        self.inner = hook
        self.inner_state = state
        self.__qualname__ = f"ddp_exporter_wrapper({getattr(hook, '__qualname__', hook)})"

    def __call__(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Run the inner hook on the bucket and time its future."""
        if not self.enabled:
            return self.inner(self.inner_state, bucket)
        try:
            buffer = bucket.buffer()
            is_last = bucket.is_last()
            t0 = self.recorder.bucket_launched(self.stats, buffer.nbytes)
            # Per-bucket hot path: skip even the call when no CUDA resolver exists.
            events = None if self.cuda is None else self._cuda_start(buffer, is_last)
        except Exception as exc:  # noqa: BLE001
            self.errors.record("comm_hook", exc)
            return self.inner(self.inner_state, bucket)
        fut = self.inner(self.inner_state, bucket)
        try:
            # A link in the chain DDP waits on, not a done-callback: DDP's wait can return
            # before a done-callback has run on the backend's thread, and the step would then
            # close without its collective (the wait counted as compute, comm_wait lost).
            return fut.then(functools.partial(_record_then, self._done, t0, is_last, events))
        except Exception as exc:  # noqa: BLE001
            self.errors.record("comm_hook", exc)
        return fut

    def _cuda_start(self, buffer: torch.Tensor, is_last: bool) -> CudaStart | None:
        if not buffer.is_cuda:
            return None
        device = buffer.device
        start = torch.cuda.Event(enable_timing=True)
        # On the bucket's device, whatever device this thread has current: both events of a
        # pair must be on one device for elapsed_time().
        start.record(torch.cuda.current_stream(device))
        # The last bucket's launch marks the end of backward compute on the compute stream.
        return (start, start if is_last else None, device)

    def _done(
        self, t0: float, is_last: bool, events: CudaStart | None, fut: torch.futures.Future
    ) -> None:
        try:
            if events is None:
                self.recorder.bucket_done(self.stats, t0, is_last)
            else:
                # NCCL: the callback runs as the collective is queued, with a stream current
                # that waits for it on the GPU (CUDA future), so this event marks its
                # completion. Gloo with CUDA tensors: a CPU future, completed on gloo's
                # thread once the result is back on the device.
                start, launch, device = events
                end = torch.cuda.Event(enable_timing=True)
                end.record(torch.cuda.current_stream(device))
                assert self.cuda is not None  # events come only with a resolver (__call__)
                self.cuda.submit((self.stats, t0, start, end, launch))
                if is_last:
                    self.recorder.boundary("comm_hook")
        except Exception as exc:  # noqa: BLE001
            self.errors.record("comm_hook", exc)


class CommHookInstrumentor:
    """Register the timing wrapper as a DDP model's comm hook; restore the model exactly.

    DDP's reducer accepts one hook, once. So the wrapper is registered at once, and the model's
    ``register_comm_hook``/``_register_builtin_comm_hook`` are shadowed by instance attributes
    that put a hook the user registers later *under* the wrapper, with DDP's own checks and
    errors. :meth:`uninstrument` deletes the shadows; the wrapper then passes buckets through.
    """

    def __init__(self, model: Any, wrapper: CommHookWrapper) -> None:
        self.model = model
        self.wrapper = wrapper
        self._patched = False

    def instrument(self) -> bool:
        """Register the wrapper; return False when a hook was registered before (not timed)."""
        model = self.model
        existing = list(getattr(model, "_comm_hooks", []))
        if existing:
            # A hook registered before instrument() cannot be wrapped. Training is untouched;
            # per-bucket timing is lost.
            log.warning(
                "ddp-exporter: a comm hook (%s) was registered before instrument(); collective "
                "latency and comm_wait are not measured. Call exporter.instrument() before "
                "ddp.register_comm_hook() to measure them.",
                getattr(existing[0][0], "__qualname__", existing[0][0]),
            )
            self.wrapper.enabled = False
            return False
        wrapper = self.wrapper
        model.register_comm_hook(wrapper.inner_state, wrapper)
        registered: list[bool] = []

        def register_comm_hook(state: object, hook: Hook) -> None:
            """Put the user's hook under the exporter's timing wrapper (DDP's signature)."""
            if registered:
                raise RuntimeError(
                    "register_comm_hook or register_builtin_comm_hook can only be called once."
                )
            model._check_comm_hook(hook)
            wrapper.set_inner(hook, state)
            model._comm_hooks.append((hook, state))
            registered.append(True)

        def _register_builtin_comm_hook(comm_hook_type: dist.BuiltinCommHookType) -> None:
            """Map a built-in hook onto its Python equivalent under the timing wrapper."""
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            if comm_hook_type == dist.BuiltinCommHookType.FP16_COMPRESS:
                register_comm_hook(model.process_group, default_hooks.fp16_compress_hook)
            else:
                register_comm_hook(model.process_group, allreduce_mean_hook)

        # Instance attributes shadow DDP's methods; uninstrument() deletes them.
        model.register_comm_hook = register_comm_hook
        # DDP's own name (private since torch 1.x; 2.4-2.14 checked).
        model._register_builtin_comm_hook = _register_builtin_comm_hook
        self._patched = True
        return True

    def uninstrument(self) -> None:
        """Stop timing and restore the model's own registration methods; idempotent."""
        self.wrapper.enabled = False
        if self._patched:
            for name in ("register_comm_hook", "_register_builtin_comm_hook"):
                self.model.__dict__.pop(name, None)
            self._patched = False
