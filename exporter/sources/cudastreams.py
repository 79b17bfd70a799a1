"""Find a GPU's current stream for a CUDA event at a fraction of ``torch.cuda``'s public cost.

``torch.cuda.current_stream()`` builds a new Stream object at each call, several microseconds of
host time; ``Event.record()`` without a stream calls it, and so does comparing the current
stream with the default one. On a step whose host is the bottleneck those microseconds land on
the step. torch's private ``_cuda_getCurrentStream`` and ``_cuda_getDefaultStream`` return the
stream as a plain ``(id, device, type)`` tuple, a fraction of a microsecond: they are looked up
once (feature-detected), and where they are missing the public calls do the same work.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["StreamLookup"]

#: A GPU's current and default streams as ``(stream id, device index, device type)`` (private).
_current = getattr(torch._C, "_cuda_getCurrentStream", None)
_default = getattr(torch._C, "_cuda_getDefaultStream", None)


class StreamLookup:
    """The current stream of GPU ``index`` (None: the current GPU), cheaply.

    The Stream object of the last stream found is kept, as one ``(key, stream)`` pair that any
    thread may replace: a thread never pairs one stream's key with another's object.
    """

    def __init__(self, index: int | None = None) -> None:
        self.index = index
        self._last: tuple[Any, Any] = (None, None)

    def _device(self) -> int:
        return self.index if self.index is not None else torch.cuda.current_device()

    def current(self) -> torch.cuda.Stream:
        """Return the GPU's current stream (the same object while it stays current)."""
        if _current is None:
            return torch.cuda.current_stream(self._device())
        key = _current(self._device())
        last_key, stream = self._last
        if key != last_key:
            stream = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
            self._last = (key, stream)
        return stream

    def on_default(self) -> bool:
        """Return whether the GPU's current stream is its default stream."""
        device = self._device()
        if _current is None or _default is None:
            return bool(torch.cuda.current_stream(device) == torch.cuda.default_stream(device))
        return bool(_current(device) == _default(device))
