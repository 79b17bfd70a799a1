"""Say where every second of a run's wall clock went: the goodput categories, defined once.

The account is the run's: one timeline, the monitoring rank's wall clock, from the first process
start of the run's first attempt to the end of its last attempt, across restarts. DDP's ranks
step in lockstep, so that rank's clock is the run's; what only another rank knows (its own work,
its declared sections) reaches it through the store (:mod:`.peers`). Every second lands in
exactly one category; they add up to the wall clock.

- ``productive``: each step counted once, at the healthy pace: the step's compute and optimizer
  time, plus its exposed communication up to the run's healthy baseline (the mean of the recent
  steps' exposed communication once every wait for a slower rank is taken out, a hiccup counted
  at most :data:`BASELINE_CLIP` times their median, scaled by how much slower than usual the
  rank's own compute ran (a busy host slows both alike), and :data:`COMM_NOISE_SHARE` above it
  still the pace; what faster steps left of it pays for slower ones, up to
  :data:`COMM_SLACK_STEPS` steps' worth, so jitter is the healthy pace). Steps redone after a restart are ``lost_work``
  instead.
- ``startup``: from the process start to the first step (imports, rendezvous, the process group,
  building the model, loading a checkpoint), in the run's first attempt. Declared sections in it
  are theirs.
- ``data``: time the step waited for its DataLoader (the run waits on input). One rank whose
  input alone is slow holds up the others: that is ``straggler`` with cause data.
- ``communication``: exposed communication beyond the healthy baseline, lasting past the slack,
  that no slower rank and no wait for a CPU explains (any rank's threads waiting to run, its
  collectives' among them, are the host's contention: a collective waits for the slowest
  participant): a slow or congested network, a collective that got slower.
- ``straggler``: the time the other ranks waited for one slow rank: whenever one rank's own work
  (compute and data, :data:`CAUSES`) over a window exceeded the typical rank's (the median) by
  more than :data:`STRAGGLER_SHARE` of it, and that rank also stood out over the recent windows
  together (:data:`.peers.PERSIST_WINDOWS`), the excess, blamed on that rank and its node. A
  window's slowest rank that does not stand out over them is jitter: the wait is productive. Blamed
  by work, never by collective latency: the straggler's is the shortest, its peers wait for it
  inside the collective.
- ``checkpoint``, ``evaluation``, ``section``: declared sections (``exporter.deadline``) that
  interrupted training, the run's own or another rank's that the run waited for; the name says
  which (:func:`section_category`: checkpoint and save names, evaluation and validation names,
  any other declared name).
- ``hang``: from a hang episode's onset (the stalled collective's start, as the hang watcher
  measured it) to the hang action's decision to abort, or until training progresses again,
  blamed on the rank behind and its node (none for a symmetric hang). A hang that recovers is
  taken out of the steps it held up: it is not also a straggler.
- ``restart``: from the end of the previous attempt (the abort decision, or the last account
  the previous attempt saved when it crashed or was killed) to this attempt's first step: the
  launcher's restart, the new processes' start, rendezvous and loading the checkpoint.
- ``lost_work``: the productive time of the steps this attempt redid: steps up to the furthest
  step an earlier attempt reached, after resuming from an earlier checkpoint
  (``instrument(start_step=...)`` says where an attempt resumed; without it nothing is known
  to be redone).
- ``other``: the remainder, kept visible and small: the tail from the last step to the end, the
  open step of an attempt that crashed, time no other category explains.

Which categories are **planned** (:data:`PLANNED`: a job spends them by design; DDPGoodputLow
judges the rest) and which are **blamed** on a rank and its node (:data:`BLAMED`) is said here
too. ETTR, effective training time ratio, is ``productive`` over the wall clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import catalog

__all__ = [
    "BADPUT",
    "BASELINE_CLIP",
    "BLAMED",
    "CATEGORIES",
    "COMM_NOISE_SHARE",
    "COMM_SLACK_STEPS",
    "CAUSES",
    "PLANNED",
    "SECTION_CATEGORIES",
    "STRAGGLER_SHARE",
    "Work",
    "category_of_cause",
    "section_category",
]

#: Every category, productive first (the ``category`` label's values, named in the catalog).
CATEGORIES: tuple[str, ...] = catalog.GOODPUT_CATEGORIES
#: Every category but productive.
BADPUT: tuple[str, ...] = CATEGORIES[1:]
#: Time a healthy job spends by design, judged by its own alerts (DDPInitStuck,
#: DDPSectionOverdue), not by DDPGoodputLow.
PLANNED: tuple[str, ...] = ("startup", "checkpoint", "evaluation", "section")
#: Categories whose time is blamed on one rank (and its node).
BLAMED: tuple[str, ...] = ("straggler", "hang")
#: What a straggler is blamed by: its own work in a step.
CAUSES: tuple[str, ...] = ("compute", "data")
#: The categories of declared sections.
SECTION_CATEGORIES: tuple[str, ...] = ("checkpoint", "evaluation", "section")
#: A window's excess of the slowest rank's work over the median rank's counts as a straggler's
#: when it is more than this share of the median (below it: the noise of synchronous steps).
STRAGGLER_SHARE = 0.05
#: The healthy baseline of exposed communication per step is the mean of recent steps', each
#: counted at most this many times their median (a hiccup is not the healthy pace).
BASELINE_CLIP = 3.0
#: Most baseline communication, in steps, that faster steps save for slower ones: jitter evens
#: out, a slowdown that lasts longer than this is ``communication``.
COMM_SLACK_STEPS = 16
#: Exposed communication up to this share above its baseline is the healthy pace: collectives
#: on a shared host drift and jitter by that much (the CPU work of gloo, a neighbour's load on
#: the cores, a baseline that trails a slow drift). A slower network costs more than that.
COMM_NOISE_SHARE = 0.10

_CHECKPOINT_WORDS = ("checkpoint", "ckpt", "save", "snapshot")
_EVALUATION_WORDS = ("eval", "valid")


def section_category(name: str) -> str:
    """Return the category of the declared section ``name``: checkpoint, evaluation or section."""
    low = name.lower()
    if any(word in low for word in _CHECKPOINT_WORDS):
        return "checkpoint"
    if any(word in low for word in _EVALUATION_WORDS):
        return "evaluation"
    return "section"


def category_of_cause(cause: str) -> str:
    """Return the category a cause of excess work lands in (compute and data: straggler)."""
    return "straggler" if cause in CAUSES else cause


@dataclass(frozen=True)
class Work:
    """One rank's own work so far in this attempt: what it did, not what it waited for.

    ``compute_s`` is the compute phase (the optimizer's is the same on every rank and not
    blamed); the section times are its declared sections that interrupted its training.
    ``cpu_wait_s`` rides along: how long the rank's threads waited for a CPU so far
    (:class:`.tracker.CpuWait`). It is no work: a rank whose work stands still has not moved.
    """

    steps: int = 0
    data_s: float = 0.0
    compute_s: float = 0.0
    checkpoint_s: float = 0.0
    evaluation_s: float = 0.0
    section_s: float = 0.0
    cpu_wait_s: float = field(default=0.0, compare=False)

    def parts(self) -> dict[str, float]:
        """Return the work by cause: data, compute and each section category."""
        return {
            "data": self.data_s,
            "compute": self.compute_s,
            "checkpoint": self.checkpoint_s,
            "evaluation": self.evaluation_s,
            "section": self.section_s,
        }

    @property
    def busy(self) -> float:
        """Return every second of own work."""
        return sum(self.parts().values())

    def minus(self, earlier: Work) -> Work:
        """Return the work done since ``earlier``."""
        return Work(
            self.steps - earlier.steps,
            self.data_s - earlier.data_s,
            self.compute_s - earlier.compute_s,
            self.checkpoint_s - earlier.checkpoint_s,
            self.evaluation_s - earlier.evaluation_s,
            self.section_s - earlier.section_s,
        )
