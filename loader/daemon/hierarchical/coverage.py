"""What the hierarchical mode loses against full-graph sampling, measured as it trains.

Two numbers per mega-batch, summed over an epoch, logged, exported and warned about:

* **Neighbour coverage**: of the neighbour slots full-graph sampling would fill for the targets a
  pass expanded (``min(fanout, full in-degree)`` per target and hop, every in-neighbour for fanout
  -1), the share the mega-batch filled (``min(fanout, in-degree inside mega-batch + static cache)``,
  exactly the pass's sampled edges). A cut neighbour is one the model never aggregates in training
  but does at evaluation over the full graph.
* **Label skew**: the total variation distance between the training labels of the mega-batch and
  those of the whole epoch. Min-cut partitions are homophilous; a skewed mega-batch pulls the model
  toward its own classes for as many steps as it lasts, which slows convergence far more than the
  lost neighbours do (docs/PERFORMANCE.md, "Training quality of the hierarchical mode"). Part of it
  is chance: a random group of as many seeds is skewed too (``chance_label_skew``), and on a small
  graph cut into many partitions that part dominates while costing nothing. What predicts the loss is
  the **excess** over chance.

The thresholds are heuristics calibrated on the shared graphs and the demo graph (documented in
docs/CONFIG.md): below ``COVERAGE_WARN``, or with a skew excess above
``max(EXCESS_SKEW_WARN, CHANCE_MULTIPLE x chance)``,
the daemon warns (at the first epoch, then every ``WARN_EVERY``-th while it holds) and names the knobs
that help.
"""

from dataclasses import dataclass

import numpy as np

from loader.daemon.hierarchical.schedule import GroupSkew
from loader.sampling.sampling import SampledPass

__all__ = ["COVERAGE_WARN", "EXCESS_SKEW_WARN", "CHANCE_MULTIPLE", "WARN_EVERY", "WarningStreaks", "NeighbourSlots",
           "neighbour_slots", "EpochQuality", "QualityKnobs", "EVERYTHING_SET", "expected_edge_coverage",
           "static_cut_share"]

COVERAGE_WARN = 0.70
"""An epoch whose neighbour coverage falls below this is warned about."""

EXCESS_SKEW_WARN = 0.05
"""An epoch whose mean label skew beyond chance (weighted by training seeds) exceeds this, and exceeds
``CHANCE_MULTIPLE`` times the chance part, is warned about. Calibrated on bench/accuracy_bench.py at R = 4
(bench/warning_check.py): amazon-photo with 32 METIS partitions lost 3-4 points at an excess of 0.14; every
configuration within half a point stayed under 0.03."""
CHANCE_MULTIPLE = 2.0
"""How many times the chance skew an epoch's excess must pass too. Chance is the *mean* deviation of a random
group; one epoch's random groups pass it often (cora with 16 of 32 partitions per mega-batch, 70 training
seeds each, crossed it in 1 epoch of 30 while training 0.8 points better than NS) and twice it rarely."""


@dataclass(frozen=True)
class NeighbourSlots:
    """Neighbour slots of a pass: ``filled`` in the mega-batch, ``full`` over the whole graph."""

    filled: int
    full: int


def neighbour_slots(sampled: SampledPass, full_degree: np.ndarray, fanouts: tuple[int, ...]) -> NeighbourSlots:
    """Slots the pass filled and the slots its targets have over the full graph (vectorized, O(nodes)).

    full_degree: int64 (M,) full-graph in-degree of each local node of the mega-batch. The targets of
    hop h are the nodes a batch first reached at hop h-1 (``num_sampled_nodes`` blocks, in order).
    """
    hops = sampled.num_hops
    if sampled.num_batches == 0 or hops == 0:
        return NeighbourSlots(0, 0)
    hop_of_block = np.tile(np.arange(hops + 1, dtype=np.int8), sampled.num_batches)
    hop_of_node = np.repeat(hop_of_block, sampled.num_sampled_nodes.ravel())
    is_target = hop_of_node < hops
    degree = full_degree[sampled.nodes[is_target]]
    fanout = np.asarray(fanouts, dtype=np.int64)[hop_of_node[is_target]]
    full = int(np.where(fanout < 0, degree, np.minimum(fanout, degree)).sum())
    return NeighbourSlots(int(sampled.num_sampled_edges.sum()), full)


@dataclass(frozen=True)
class QualityKnobs:
    """Where the settings that help stand, so a warning names only those the user can still turn."""

    schedule_balanced: bool
    """``[hierarchy] schedule = "balanced"`` is in effect."""
    fraction_auto: bool
    """``megabatch_fraction = "auto"``: the mega-batch is already the largest the budget holds."""
    whole_graph: bool
    """A mega-batch holds every partition (nothing is left to raise)."""
    static_cache_off: bool
    """``static_cache = false``."""
    partitions: int
    advised_partitions: int
    """``prepare --partitions auto``'s count for this graph (``loader.format.partition_count``)."""
    float32_features: bool = False
    """Features stored as float32: ``prepare --feat-dtype float16`` (or ``uint8``) would fit twice (four times) the
    partitions in a mega-batch."""

    def for_coverage(self) -> list[str]:
        knobs = []
        if not self.whole_graph:
            knobs.append("raise [memory] budget (the mega-batch is already the largest it holds)"
                         if self.fraction_auto else "raise [hierarchy] megabatch_fraction (or set it to \"auto\")")
        if self.static_cache_off:
            knobs.append("set [hierarchy] static_cache = \"auto\"")
        knobs.append("use [loader] mode = \"staged\" or \"exact\" (every neighbour, exact batches)")
        return knobs

    def for_skew(self) -> list[str]:
        knobs = []
        if not self.schedule_balanced:
            knobs.append("set [hierarchy] schedule = \"balanced\"")
        if self.partitions < self.advised_partitions:
            knobs.append(f"prepare with --partitions auto ({self.advised_partitions} partitions, not "
                         f"{self.partitions}: more, smaller partitions mix better at the same fraction)")
        if not self.whole_graph:
            knobs.append("raise [memory] budget" if self.fraction_auto else "raise [hierarchy] megabatch_fraction")
            if self.float32_features:
                knobs.append("prepare with --feat-dtype float16 or uint8 (two or four times the partitions in a "
                             "mega-batch at the same budget; docs/PERFORMANCE.md, \"Remedy: float16 features\" and "
                             "\"Remedy: 8-bit feature codes\")")
        knobs.append("use [loader] mode = \"staged\" or \"exact\"")
        return knobs


EVERYTHING_SET = QualityKnobs(schedule_balanced=True, fraction_auto=True, whole_graph=False, static_cache_off=False,
                              partitions=1, advised_partitions=1)
"""Knobs of a default configuration on a dataset prepared with ``--partitions auto`` (tests and callers without
a config)."""


class EpochQuality:
    """Accumulates one epoch's coverage and skew, mega-batch by mega-batch (the sampler stage owns it)."""

    def __init__(self) -> None:
        self.filled = 0
        self.full = 0
        self.skew_weighted = 0.0
        self.chance_weighted = 0.0
        self.seeds = 0
        self.megabatches = 0

    def add(self, slots: NeighbourSlots, skew: GroupSkew, seeds: int) -> None:
        self.filled += slots.filled
        self.full += slots.full
        self.skew_weighted += skew.skew * seeds
        self.chance_weighted += skew.chance * seeds
        self.seeds += seeds
        self.megabatches += 1

    @property
    def coverage(self) -> float:
        """Filled / full slots (1.0 when nothing was sampled: nothing was lost)."""
        return self.filled / self.full if self.full else 1.0

    @property
    def skew(self) -> float:
        """Seed-weighted mean label skew of the epoch's mega-batches."""
        return self.skew_weighted / self.seeds if self.seeds else 0.0

    @property
    def chance(self) -> float:
        """Seed-weighted mean of the skew random groups of the mega-batches' sizes would have."""
        return self.chance_weighted / self.seeds if self.seeds else 0.0

    @property
    def excess(self) -> float:
        """Skew beyond chance: what grouping by partitions adds (the part that costs accuracy)."""
        return max(0.0, self.skew - self.chance)

    def warnings(self, knobs: QualityKnobs = EVERYTHING_SET) -> dict[str, str]:
        """What is wrong with this epoch's batches ("coverage", "skew") and the knobs that help, naming only
        those not already set (``knobs``); empty when all is well."""
        found = {}
        if self.coverage < COVERAGE_WARN:
            found["coverage"] = (f"neighbour coverage {self.coverage:.3f} is below {COVERAGE_WARN}: "
                                 f"{100 * (1 - self.coverage):.0f}% of the neighbours full-graph sampling would draw "
                                 f"lie outside the mega-batches; {'; or '.join(knobs.for_coverage())}")
        limit = max(EXCESS_SKEW_WARN, CHANCE_MULTIPLE * self.chance)
        if self.excess > limit:
            found["skew"] = (f"label skew {self.skew:.3f} is {self.excess:.3f} beyond the {self.chance:.3f} random "
                             f"groups of seeds have (limit {limit:.3f}): mega-batches' training labels differ from the "
                             f"epoch's and training converges slower and lower; {'; or '.join(knobs.for_skew())}")
        return found


WARN_EVERY = 10
"""A quality warning that holds epoch after epoch is logged at its first epoch and then every this many."""


class WarningStreaks:
    """Which epochs' quality warnings reach the log: the first of a streak, then every ``WARN_EVERY``-th.

    The condition is a property of the dataset and the config, so it holds for every epoch of a run; a
    line per epoch buries everything else in the log (a short-epoch soak wrote 55 in 30 s). The metric
    ``megabatch_quality_warnings_total`` still counts every epoch.
    """

    def __init__(self) -> None:
        self._streak: dict[str, int] = {}

    def to_log(self, kinds: set[str]) -> set[str]:
        for kind in set(self._streak) - kinds:
            del self._streak[kind]  # the condition cleared: the next occurrence is news again
        logged = set()
        for kind in kinds:
            count = self._streak.get(kind, 0)
            if count % WARN_EVERY == 0:
                logged.add(kind)
            self._streak[kind] = count + 1
        return logged


def static_cut_share(static_cut_edges: int, cut_edges: int) -> float:
    """The share of the graph's ``cut_edges`` that leave static nodes: ``expected_edge_coverage``'s
    ``static_share``; at most 1 whatever the manifest's count says, and 0 for a graph with no cut."""
    return min(1.0, static_cut_edges / cut_edges) if cut_edges else 0.0


def expected_edge_coverage(edge_cut: float, partitions: int, per_megabatch: int, static_share: float = 0.0) -> float:
    """The share of a mega-batch's in-edges whose source it holds, on average.

    An uncut edge always stays; a cut one stays when its source's partition is among the other
    ``per_megabatch - 1`` of the ``partitions - 1``, or when its source is a static node:
    ``static_share`` is the share of cut edges that leave static nodes. Slot coverage is at least
    this where degrees exceed the fanouts (a node keeps its fanout from fewer neighbours).
    """
    if partitions <= 1:
        return 1.0
    return 1.0 - edge_cut * (1.0 - (per_megabatch - 1) / (partitions - 1)) * (1.0 - static_share)
