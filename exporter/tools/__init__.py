"""The command-line tools around a training job, one ``ddp-exporter`` command for all of them.

``demo``, ``top``, ``hangs``, ``doctor``, ``nodes``, ``mixin`` and ``receiver``: each module owns
its parser and its ``run``; :mod:`exporter.tools.cli` dispatches. Nothing here is imported by
``import exporter`` or runs in a training process, except the demo's trainer
(:mod:`exporter.tools.trainer`), which is an example of a user's script. The tools import no
torch and no optional library until a command needs one, so they start fast on a login node or
a laptop, and on a base install.
"""
