"""MariusGNN's partition buffer orders for link prediction: which partitions are resident when, and
which edge bucket is trained in which buffer state. A pure planning module: no I/O, no kernels.

Terms. The prepared dataset has p physical partitions; edge bucket (i, j) holds the edges from
partition i to partition j (p * p buckets, the diagonal (i, i) included). A buffer of capacity c
holds c physical partitions in RAM; a bucket can be trained only in a buffer state where both i
and j are resident. A plan is a sequence of states, each one swap away from the last; an epoch
reads the first state whole and then each swap's incoming partitions (``BufferPlan.loads``), so
its I/O in partitions is ``BufferPlan.io_partitions``.

BETA (``beta_plan``, the greedy baseline): the buffer holds c physical partitions, and each step
swaps one out for the one that brings the most pairs not yet co-resident. Every bucket is trained
in the FIRST state where both its partitions are resident, so every bucket trained after a swap
has the incoming partition as an endpoint: a state's training examples are correlated (all
incident to one partition), which SGD does not expect and which costs accuracy (MariusGNN,
EuroSys '23, Figure 4 and its COMET-vs-BETA table; ``bucket_correlation`` measures it).

COMET (``comet_plan``) adds randomness at two levels:

1. ``logical_groups``: the p physical partitions are grouped at random into l logical partitions
   (sizes differ by at most one); the buffer holds c_l logical partitions, and the greedy above
   runs over logical partitions (``comet_states``): one logical partition is swapped per step
   until every pair of logical partitions has been co-resident. Small physical partitions keep
   few nodes together for good; large logical ones make few, large reads.
2. Every bucket (i, j) is trained in a state drawn uniformly at random among the states where
   both i and j are resident, each directed bucket on its own, as MariusGNN's
   ``randomlyAssignEdgeBucketsToBuffers`` does: a state's buckets come from many partitions
   (``BufferPlan.bucket_state``). The product goes one step further by default: ``buffer_order`` splits
   each bucket's edges at random among all those states (``bucket_shares`` says which share is whose), so
   no state trains a partition's whole own bucket.

Choosing l (``default_logical``). MariusGNN sets l = 2p/c, the least l under its constraints
c_l >= 2 and p/c = l/c_l (so c_l = 2: the buffer holds two logical partitions of c/2 physical
ones); fewer logical partitions means less I/O and less bias. That is exact only when c is even and
c/2 divides p; for any other (p, c) the buffer capacity is a bound not to exceed, so we take the
least l for which two of the largest logical partitions fit: l = ceil(p / floor(c / 2)), and then
c_l = floor(c / ceil(p / l)), as many of the largest as fit (``logical_capacity``), which equals 2
in MariusGNN's case. A buffer that holds the whole graph (c >= p) needs no swaps: l = 1, one state.
c < 2 with p > c cannot train bucket (i, j), i != j, and is refused (ValueError).

The greedy (``comet_states`` over l and c_l, ``beta_plan`` over p and c), exactly, so that it can
be re-implemented: n items, capacity k < n, a numpy ``Generator`` g. State 0 is the first k items of
``g.permutation(n)``, sorted. While some pair of items has never been co-resident: for every
resident s (ascending) and every outside x (ascending), gain(s, x) = the pairs (x, t), t resident
and t != s, not yet co-resident. Score = gain when its maximum is positive; otherwise (no swap
gains anything now) score(s, x) = the pairs of x with any item not yet co-resident, so that x
comes in and its missing partner can follow at the next step (the greedy cannot stall). Among the
(s, x) of maximal score, enumerated row-major (s, then x), the one at index ``g.integers(count)``
is taken: s goes out, x comes in, and the new state (sorted) is appended. Each step trades one item,
and a positive gain comes at least every second step, so the loop ends after at most
2 * (n (n - 1) / 2 - k (k - 1) / 2) steps.

Random streams, all ``numpy.random.Generator(PCG64([seed, STREAM, epoch]))``: ``STREAM_GROUPS``
(``logical_groups``: ``g.permutation(p)``; the first ceil(p/l) of it are logical partition 0, and
so on, the first p mod l partitions one larger), ``STREAM_STATES`` (``comet_states``' greedy),
``STREAM_BUCKETS`` (COMET's assignment: for each state t in order, with its resident physical
partitions R ascending, ``g.random((len(R), len(R)))`` gives a key to each bucket (R[a], R[b]); a
bucket goes to the state where its key was largest, which is uniform among its co-resident
states), ``STREAM_BETA`` (``beta_plan``'s greedy). A plan is a pure function of its arguments and
differs from epoch to epoch.
"""

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

__all__ = ["BufferPlan", "Policy", "STREAM_GROUPS", "STREAM_STATES", "STREAM_BUCKETS", "STREAM_BETA",
           "default_logical", "logical_capacity", "logical_groups", "comet_states", "comet_plan", "beta_plan",
           "bucket_order", "bucket_shares", "bucket_correlation"]

Policy = Literal["comet", "beta"]

STREAM_GROUPS = 0xC0E7_0001
"""PCG64 stream of ``logical_groups`` (the random grouping of physical into logical partitions)."""
STREAM_STATES = 0xC0E7_0002
"""PCG64 stream of ``comet_states`` (the greedy over logical partitions and its ties)."""
STREAM_BUCKETS = 0xC0E7_0003
"""PCG64 stream of COMET's bucket assignment (a bucket's state among those where both ends are resident)."""
STREAM_BETA = 0xBE7A_0001
"""PCG64 stream of ``beta_plan``'s greedy over physical partitions."""


def _rng(seed: int, stream: int, epoch: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, stream, epoch]))


def _as_ids(values: np.ndarray, what: str) -> np.ndarray:
    ids = np.ascontiguousarray(values, dtype=np.int64)
    if ids.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {ids.shape}")
    return ids


@dataclass(frozen=True, eq=False)
class BufferPlan:
    """One epoch's buffer order: planner -> the link-prediction batch order (which buckets, when)."""

    policy: Policy
    """"comet" or "beta"."""
    num_partitions: int
    """p, the prepared dataset's physical partitions."""
    capacity: int
    """c, the most physical partitions resident at once (every state holds at most this many)."""
    logical_of: np.ndarray
    """int64 (p,): the logical partition of each physical one (BETA: ``arange(p)``, each its own)."""
    states: list[np.ndarray]
    """int64, ascending: the physical partitions resident in each state, in the order the epoch visits them."""
    loads: list[np.ndarray]
    """int64, ascending: what each state reads before it trains (state 0: all of it; then the swap's incoming)."""
    bucket_state: np.ndarray
    """int64 (p, p): the state in which bucket (i, j) (edges from partition i to j) is trained."""
    seed: int
    epoch: int
    num_logical: int = field(init=False)
    """l, the logical partitions (``logical_of.max() + 1``; p for BETA)."""

    def __post_init__(self) -> None:
        p = self.num_partitions
        if self.policy not in ("comet", "beta"):
            raise ValueError(f"BufferPlan.policy must be 'comet' or 'beta', got {self.policy!r}")
        if p < 1 or self.capacity < 1:
            raise ValueError(f"BufferPlan: need p >= 1 and c >= 1, got p={p}, c={self.capacity}")
        logical_of = _as_ids(self.logical_of, "BufferPlan.logical_of")
        if logical_of.shape != (p,) or logical_of.min() < 0:
            raise ValueError(f"BufferPlan.logical_of: shape {logical_of.shape}, expected ({p},) of ids >= 0")
        states = [_as_ids(s, f"BufferPlan.states[{t}]") for t, s in enumerate(self.states)]
        loads = [_as_ids(s, f"BufferPlan.loads[{t}]") for t, s in enumerate(self.loads)]
        if not states or len(loads) != len(states):
            raise ValueError(f"BufferPlan: {len(states)} states and {len(loads)} loads, need as many and at least 1")
        for t, members in enumerate(states):
            if (len(members) == 0 or len(members) > self.capacity or members[0] < 0 or members[-1] >= p
                    or (np.diff(members) <= 0).any()):
                raise ValueError(f"BufferPlan.states[{t}] = {members.tolist()}: need 1..{self.capacity} "
                                 f"ascending distinct ids in [0, {p})")
            # loads are derived, not chosen: checking them here keeps a hand-built plan honest about its I/O
            expected = members if t == 0 else np.setdiff1d(members, states[t - 1], assume_unique=True)
            if not np.array_equal(loads[t], expected):
                raise ValueError(f"BufferPlan.loads[{t}] = {loads[t].tolist()}, but the state reads "
                                 f"{expected.tolist()}")
        bucket_state = np.ascontiguousarray(self.bucket_state, dtype=np.int64)
        if bucket_state.shape != (p, p):
            raise ValueError(f"BufferPlan.bucket_state: shape {bucket_state.shape}, expected ({p}, {p})")
        if bucket_state.min() < 0 or bucket_state.max() >= len(states):
            raise ValueError(f"BufferPlan.bucket_state: states {bucket_state.min()}..{bucket_state.max()}, "
                             f"outside [0, {len(states)})")
        object.__setattr__(self, "logical_of", logical_of)
        object.__setattr__(self, "states", states)
        object.__setattr__(self, "loads", loads)
        object.__setattr__(self, "bucket_state", bucket_state)
        object.__setattr__(self, "num_logical", int(logical_of.max()) + 1)

    @property
    def num_states(self) -> int:
        return len(self.states)

    @property
    def io_partitions(self) -> int:
        """Physical partitions read in the epoch: the sum of ``loads``."""
        return sum(len(s) for s in self.loads)


def _check_counts(num_partitions: int, capacity: int) -> None:
    if num_partitions < 1:
        raise ValueError(f"need at least one physical partition, got p={num_partitions}")
    if capacity < 1:
        raise ValueError(f"buffer capacity must be at least 1 partition, got c={capacity}")
    if capacity < min(2, num_partitions):
        raise ValueError(f"buffer capacity c={capacity} with p={num_partitions} partitions: a bucket (i, j), "
                         f"i != j, trains only while both are resident, so c must be at least 2")


def default_logical(num_partitions: int, capacity: int) -> int:
    """l for p physical partitions and a buffer of c: MariusGNN's 2p/c where c is even and c/2 divides p.

    In general the least l for which two of the largest logical partitions fit in c:
    ceil(p / floor(c / 2)); 1 when c >= p (the whole graph is resident, nothing to swap).
    ValueError when p < 1, or c < 2 while c < p.
    """
    _check_counts(num_partitions, capacity)
    if capacity >= num_partitions:
        return 1
    return -(-num_partitions // (capacity // 2))


def logical_capacity(num_partitions: int, capacity: int, num_logical: int) -> int:
    """c_l: the logical partitions the buffer holds, as many of the largest (ceil(p / l) physical) as fit in c.

    2 for ``default_logical``'s l in MariusGNN's case (c even, c/2 dividing p), so that p/c = l/c_l;
    l when c >= p (one state). ValueError when l is outside [1, p] or c holds fewer than two logical
    partitions of that size (l below ``default_logical``).
    """
    _check_counts(num_partitions, capacity)
    if not 1 <= num_logical <= num_partitions:
        raise ValueError(f"logical partitions l={num_logical} outside [1, p={num_partitions}]")
    if capacity >= num_partitions:
        return num_logical
    largest = -(-num_partitions // num_logical)
    held = min(num_logical, capacity // largest)
    if held < 2:
        raise ValueError(f"l={num_logical} logical partitions of up to {largest} physical ones: a buffer of "
                         f"c={capacity} holds {held}, COMET needs at least 2 (take l >= "
                         f"{default_logical(num_partitions, capacity)})")
    return held


def logical_groups(num_partitions: int, num_logical: int, seed: int, epoch: int) -> np.ndarray:
    """int64 (p,): the logical partition of each physical one, a random grouping with sizes differing by at most one.

    The first ``p mod l`` logical partitions have ceil(p / l) members, the others floor(p / l);
    which physical partitions is ``STREAM_GROUPS``' permutation (module docstring).
    """
    if not 1 <= num_logical <= num_partitions:
        raise ValueError(f"logical partitions l={num_logical} outside [1, p={num_partitions}]")
    order = _rng(seed, STREAM_GROUPS, epoch).permutation(num_partitions)
    sizes = np.full(num_logical, num_partitions // num_logical, dtype=np.int64)
    sizes[:num_partitions % num_logical] += 1
    logical_of = np.empty(num_partitions, dtype=np.int64)
    logical_of[order] = np.repeat(np.arange(num_logical, dtype=np.int64), sizes)
    return logical_of


def _greedy_states(n: int, capacity: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The greedy of the module docstring over items 0..n-1: each state's items, ascending."""
    first = np.sort(rng.permutation(n)[:capacity]).astype(np.int64)
    if capacity >= n:
        return [np.arange(n, dtype=np.int64)]
    uncovered = ~np.eye(n, dtype=bool)  # pairs never co-resident yet; an item is always with itself
    uncovered[np.ix_(first, first)] = False
    resident = np.zeros(n, dtype=bool)
    resident[first] = True
    left = int(uncovered.sum()) // 2
    members = first
    states = [members]
    while left:
        rows = uncovered[members]  # (k, n): which pairs of each resident item are still missing
        # swapping members[r] out for x gains x's missing pairs with every resident but members[r]
        score = rows.sum(axis=0)[None, :] - rows
        if score[:, ~resident].max() <= 0:
            # nothing gains now: bring in an item with missing pairs (its partners are all outside),
            # so that one of them gains at the next step
            score = np.broadcast_to(uncovered.sum(axis=0), rows.shape).copy()
        score[:, resident] = -1  # only outside items can come in; -1 is below every real score
        top = np.flatnonzero(score == score.max())
        pick = int(top[rng.integers(len(top))])
        out, incoming = int(members[pick // n]), pick % n
        resident[out] = False
        resident[incoming] = True
        members = np.flatnonzero(resident)
        left -= int(uncovered[incoming, members].sum())
        uncovered[incoming, members] = False
        uncovered[members, incoming] = False
        states.append(members)
    return states


def comet_states(num_logical: int, capacity: int, seed: int, epoch: int) -> list[np.ndarray]:
    """COMET's sequence of buffer states over logical partitions: int64 ids, ascending, one per state.

    ``capacity`` is c_l, in logical partitions. State 0 is c_l random logical partitions; each next
    state swaps one logical partition, greedily (the most pairs never co-resident; ties at random;
    ``STREAM_STATES``), until every pair has been co-resident. One state when c_l >= l.
    """
    if num_logical < 1:
        raise ValueError(f"need at least one logical partition, got l={num_logical}")
    if capacity < min(2, num_logical):
        raise ValueError(f"a buffer of c_l={capacity} logical partitions out of l={num_logical} never holds a "
                         f"pair: c_l must be at least 2")
    return _greedy_states(num_logical, min(capacity, num_logical), _rng(seed, STREAM_STATES, epoch))


def _loads(states: list[np.ndarray]) -> list[np.ndarray]:
    return [states[0]] + [np.setdiff1d(now, before, assume_unique=True) for before, now in zip(states, states[1:])]


def _assign_at_random(states: list[np.ndarray], num_partitions: int, rng: np.random.Generator) -> np.ndarray:
    """Each bucket's state, uniform among those where both its ends are resident (module docstring).

    The largest of independent uniform keys falls on each candidate with equal probability, so one
    pass over the states (a few thousand numpy blocks) draws every bucket without listing its candidates.
    """
    best = np.full((num_partitions, num_partitions), -1.0)
    chosen = np.full((num_partitions, num_partitions), -1, dtype=np.int64)
    for t, members in enumerate(states):
        block = np.ix_(members, members)
        keys = rng.random((len(members), len(members)))
        wins = keys > best[block]
        best[block] = np.where(wins, keys, best[block])
        chosen[block] = np.where(wins, t, chosen[block])
    return chosen


def _assign_first(states: list[np.ndarray], num_partitions: int) -> np.ndarray:
    """Each bucket's first state where both its ends are resident (BETA)."""
    chosen = np.full((num_partitions, num_partitions), -1, dtype=np.int64)
    for t, members in enumerate(states):
        block = np.ix_(members, members)
        chosen[block] = np.where(chosen[block] < 0, t, chosen[block])
    return chosen


def comet_plan(num_partitions: int, capacity: int, num_logical: int | None = None, *, seed: int,
               epoch: int) -> BufferPlan:
    """COMET's plan for p physical partitions and a buffer of c (l: ``default_logical`` when None).

    ``logical_groups`` -> ``comet_states`` over l with c_l = ``logical_capacity(p, c, l)`` -> each
    state's physical partitions -> every bucket assigned at random among its co-resident states.
    Each step reads one logical partition (ceil or floor of p / l physical ones).
    """
    if num_logical is None:
        num_logical = default_logical(num_partitions, capacity)
    held = logical_capacity(num_partitions, capacity, num_logical)
    logical_of = logical_groups(num_partitions, num_logical, seed, epoch)
    states = [np.flatnonzero(np.isin(logical_of, group)).astype(np.int64)
              for group in comet_states(num_logical, held, seed, epoch)]
    bucket_state = _assign_at_random(states, num_partitions, _rng(seed, STREAM_BUCKETS, epoch))
    return BufferPlan("comet", num_partitions, capacity, logical_of, states, _loads(states), bucket_state,
                      seed, epoch)


def beta_plan(num_partitions: int, capacity: int, seed: int, epoch: int) -> BufferPlan:
    """BETA's plan: the greedy over physical partitions (one swapped per step, ``STREAM_BETA``), each
    bucket trained in the first state where both its ends are resident."""
    _check_counts(num_partitions, capacity)
    states = _greedy_states(num_partitions, min(capacity, num_partitions), _rng(seed, STREAM_BETA, epoch))
    bucket_state = _assign_first(states, num_partitions)
    return BufferPlan("beta", num_partitions, capacity, np.arange(num_partitions, dtype=np.int64), states,
                      _loads(states), bucket_state, seed, epoch)


def bucket_order(plan: BufferPlan) -> list[np.ndarray]:
    """Per state, int64 (k, 2): the buckets (i, j) trained there, ascending by (i, j).

    Both directions (i, j) and (j, i) and the diagonal (i, i) are buckets of their own; together the
    lists hold each of the p * p buckets exactly once.
    """
    p = plan.num_partitions
    flat = np.argsort(plan.bucket_state, axis=None, kind="stable")  # grouped by state, row-major within
    counts = np.bincount(plan.bucket_state.ravel(), minlength=plan.num_states)
    pairs = np.stack(np.divmod(flat, p), axis=1).astype(np.int64)
    return np.split(pairs, np.cumsum(counts)[:-1])


def bucket_shares(plan: BufferPlan) -> tuple[np.ndarray, list[np.ndarray]]:
    """What splitting every bucket's edges among all its co-resident states needs (``buffer_order``'s edge
    assignment): int64 (p, p), the states in which each bucket's two partitions are both resident (>= 1 for every
    bucket of a complete plan), and per state t an int64 (k_t, k_t) block, k_t = len(states[t]): the share
    (0-based) of bucket (states[t][a], states[t][b]) that state t trains, the count of earlier co-resident states.
    Over a plan each bucket's shares 0..count-1 fall on its co-resident states once each, in plan order."""
    seen = np.zeros((plan.num_partitions, plan.num_partitions), dtype=np.int64)
    shares = []
    for members in plan.states:
        block = np.ix_(members, members)
        shares.append(seen[block].copy())
        seen[block] += 1
    return seen, shares


def bucket_correlation(plan: BufferPlan) -> float:
    """How much a state's training buckets share one partition: over the states, the off-diagonal buckets
    trained there that have the state's most frequent endpoint, divided by all off-diagonal buckets.

    Near 1 for BETA (every bucket of a swap state has the incoming partition as an end), about
    2 / (partitions resident) when buckets are spread (COMET). 0 for a plan without off-diagonal buckets.
    """
    p = plan.num_partitions
    i, j = np.divmod(np.arange(p * p, dtype=np.int64), p)
    off = i != j
    state = plan.bucket_state.ravel()[off]
    # a bucket counts once for each end: (state, partition) incidences
    ends = np.bincount(np.concatenate([state * p + i[off], state * p + j[off]]), minlength=plan.num_states * p)
    total = int(off.sum())
    return float(ends.reshape(plan.num_states, p).max(axis=1).sum() / total) if total else 0.0
