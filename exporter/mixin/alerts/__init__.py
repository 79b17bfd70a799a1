"""The alerting rules, one module per domain, each a function of the configuration.

- :mod:`.liveness`: ranks down, a run killed, training stalled;
- :mod:`.collectives`: collectives stalled or near their timeout, naming the rank behind;
- :mod:`.hang_action`: the hang action aborted a run, or stopped after aborts without progress;
- :mod:`.performance`: stragglers, input-bound ranks, throughput drops, GPU memory;
- :mod:`.gpu`: a straggler on a throttled GPU, a GPU that reports hardware errors;
- :mod:`.outside_loop`: init stuck, version skew, sections overdue, a deadline missed;
- :mod:`.misconfigured`: a variable of the exporter the ranks cannot use;
- :mod:`.goodput`: a run that turns too little of its time into training, and what it lost;
- :mod:`.fleet`: a node blamed run after run, a shard the global server cannot read (the
  fleet's own rule group, after its records: :mod:`exporter.mixin.fleet`).

What several domains read (the ranks that ended cleanly, the runs the hang action ended, where
a hung rank is stuck) is in :mod:`.shared`. :mod:`exporter.mixin.rules` puts them all in order,
takes the alert names from them, and writes the rule file.
"""

from __future__ import annotations

__all__: list[str] = []
