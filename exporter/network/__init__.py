"""Tell what the network between a job's machines does: who reaches whom, how fast, what broke.

One room for every network concern, one job per module, used by the init watch, the hang
watcher and the doctor alike:

- :mod:`.netcheck`: a TCP connect to a peer, and why it failed (refused, dropped, unreachable,
  unresolved); the address the backend advertises for this rank;
- :mod:`.reach`: which peers each rank tries, and who is unreachable from what they found;
- :mod:`.probe`: the probe listener every rank runs, and the transfers that try it;
- :mod:`.findings`: what a probe round asks, answers and finds, as typed values;
- :mod:`.judge`: a stuck collective's probe results judged into a broken link, a node nobody
  reaches, or "not the network";
- :mod:`.links`: pairwise link bandwidth between nodes over the job's own backend (the doctor).

Nothing here imports torch at module level or knows about hangs: the hang watcher
(:mod:`exporter.hangs.probing`) runs the probe rounds over its store channel, the doctor
(:mod:`exporter.tools.doctor`) its own exchange.
"""
