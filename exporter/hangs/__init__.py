"""Hangs, from definition to verdict: the one room for everything about a hung collective.

- :mod:`~exporter.hangs.definition`: when a collective is hung and which ranks are to blame,
  shared by ``top``, the generated alert rules and the watcher;
- :mod:`~exporter.hangs.capture`: one rank's state (every thread's stack, step, phase) and its
  short summary;
- :mod:`~exporter.hangs.dumps`: episode folders and user-only dump files on disk;
- :mod:`~exporter.hangs.protocol`: what the ranks exchange (reports, dump requests, acks,
  episodes, actions, ledger entries) as frozen dataclasses; :mod:`~exporter.hangs.codec`: their
  JSON, the one module that knows its keys; :mod:`~exporter.hangs.channel`: their way through
  the c10d store;
- :mod:`~exporter.hangs.watcher`: the background thread of one rank, composing what every rank
  does (:mod:`~exporter.hangs.responder`: report, dump, ack, leave) with what the monitoring
  rank does (:mod:`~exporter.hangs.monitor`: decide, collect, write the verdict, act);
- :mod:`~exporter.hangs.verdict`: who is stuck where, culprits first (also
  ``ddp-exporter hangs DIR``);
- :mod:`~exporter.hangs.action`: with ``on_hang="abort"``, when a hang ends the run and how
  every rank leaves together.

Only the watcher and its roles need torch (through the in-flight sources they are handed; the
action imports it only to abort NCCL communicators); the definition, the protocol and its codec,
the capture and the verdict import none, so the offline tools stay light. Every module here is
type-checked strictly (``[tool.mypy]`` in pyproject.toml).
"""
