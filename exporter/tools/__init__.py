"""The command-line tools around a training job: ``ddp-exporter demo``, ``top``, ``hangs``, ``doctor``.

Nothing here is imported by ``import exporter`` or runs in a training process, except the demo's
trainer (:mod:`exporter.tools.trainer`), which is an example of a user's script. ``top`` and
``hangs`` import no torch, so they start fast on a login node or a laptop.
"""
