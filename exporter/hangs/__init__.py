"""Hangs, from definition to verdict: the one room for everything about a hung collective.

- :mod:`~exporter.hangs.definition`: when a collective is hung and which ranks are to blame,
  shared by ``top``, the generated alert rules and the watcher;
- :mod:`~exporter.hangs.capture`: one rank's state (every thread's stack, step, phase) and its
  short summary;
- :mod:`~exporter.hangs.dumps`: episode folders and user-only dump files on disk;
- :mod:`~exporter.hangs.watcher`: the background thread that reports, decides, asks every
  rank for a dump and writes the episode's verdict;
- :mod:`~exporter.hangs.verdict`: who is stuck where, culprits first (also
  ``ddp-exporter hangs DIR``);
- :mod:`~exporter.hangs.action`: with ``on_hang="abort"``, when a hang ends the run and how
  every rank leaves together.

Only the watcher needs torch (through the in-flight sources it is handed; the action imports
it only to abort NCCL communicators); the definition, the capture and the verdict import none,
so the offline tools stay light.
"""
