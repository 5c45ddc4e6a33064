"""Belady-optimal feature-cache plans for a superbatch ("changeset precomputation", Ginex §3.3-3.4).

A loader samples a superbatch of T mini-batches ahead of time, so every feature access of the
superbatch is known before the first gather. ``plan_cache`` turns that trace into a plan that
keeps a RAM cache of C feature rows optimal; ``loader.caches.feature_cache.FeatureCache`` applies it.

Model
-----
* Iteration t (0 <= t < T) accesses the set R_t of node ids (a batch's ``n_id``, distinct
  within the iteration). S_t is the set of ids cached before iteration t, |S_t| <= C; C may
  be 0, and then every access misses.
* Hits are R_t ∩ S_t, misses R_t \\ S_t, each missing row read once. After the gather the cache
  may be updated from the batch buffer: S_{t+1} ⊆ S_t ∪ R_t, |S_{t+1}| <= C.
* Before iteration 0 a fill step ("iteration -1") sets S_0: the C ids with the earliest first
  access among the ids of the trace (an id not accessed in the superbatch is not wanted), ties
  broken in favour of the ``prior`` state (the ids cached by the previous superbatch), so a
  tie never costs a read. Ids of S_0 not in the prior are read into slots (the fill reads).
* Belady: S_{t+1} = the (at most) C ids of S_t ∪ R_t with the smallest next access > t, among
  those accessed again in the superbatch. An id is never inserted unless accessed again.
* ``num_misses`` = Σ_t |R_t \\ S_t|; the fill reads are ``num_fill``, counted apart.

S_t above is the logical state. Physically a slot whose id is not accessed again is not
cleared: it is refilled only when a slot is needed, least recently used first (prior ids the
superbatch never accesses before all others), so the final state can seed the next fill.
Such stale ids are never accessed again in the superbatch, so they change no hit or miss.

Plan format (``CachePlan``)
---------------------------
* ``fill_ids``/``fill_slots``: the rows to read into slots before iteration 0, sorted by id (so
  the reads go in file order); ``fill_evicted_ids``: the prior id each replaces, or -1 for a
  free slot.
* ``hit_slot`` [L], one per trace entry: the slot holding the id at its access, or -1 (miss).
  An executor needs no address table: hits copy ``cache[hit_slot[i]]``, misses are read.
* Updates per iteration, CSR by ``update_ptr`` [T+1]: ``update_slots``, ``update_positions``
  (the row within the iteration's batch buffer: Ginex's in_positions), ``update_ids`` (in_ids)
  and ``evicted_ids`` (out_ids, -1 where the slot was free), in no particular order within an
  iteration (slots are distinct). Applied after the gather of t.
* ``final_ids``/``final_slots``: the physical state after iteration T-1 (``final_state`` is the
  ``prior`` of the next superbatch).

Algorithm
---------
1. Next access: one backward pass with ``last_seen`` (a num_nodes-sized scratch, -1) gives each
   trace entry i of iteration t ``next_iter[i]``, the next iteration > t accessing the same id
   (T = never), and leaves every id's first access in the scratch (a repeat in one iteration is
   found here). The entries whose id's first access is their own iteration are the distinct ids.
2. Every cached id sits in bucket b = its next access (0 <= b <= T, T = not again): singly
   linked lists over slot indices (``head``/``tail``/``size`` [T+1], ``nxt`` per node), with
   ``slot_of[id]`` (the same scratch, reset to -1) and ``id_of[slot]``. ``top`` bounds the
   highest non-empty bucket. One link per node is enough because a node leaves a list only at
   its head or with its whole bucket (below).
3. Iteration t: bucket t holds exactly S_t ∩ R_t (a cached id accessed at t has next access t,
   and every id of bucket t is accessed at t), so it is dropped whole after the pass over R_t
   (its size is checked against the hits). A hit records its slot and is appended to bucket
   ``next_iter[i]``. A miss accessed again becomes a pending node (index >= C) at the head of
   bucket ``next_iter[i]``. Then, while cached + pending > C, the head of the highest non-empty
   bucket is popped (scanning ``top`` down): a pending node is dropped (bypass), a cached id is
   evicted and its slot freed. Pops take heads and pending nodes enter at heads, so the
   survivors of a bucket are its pending prefix: each is replaced in place by a free slot
   (lowest first) and recorded as an update. Since eviction happens only while the cache
   would overflow, every slot freed in a step is refilled in the same step (the out_id of
   its update). The fill is the same step with the prior as the cached state and the distinct
   ids, each at its first access, as the batch.

Complexity: O(L + C + k + T^2) time for L trace entries and k prior ids, plus O(F log F) to
sort the F <= C fill rows by id; memory: num_nodes scratch integers (int32 while C < 2^31-1),
next_iter and hit_slot (int32, L each), 4 int64 per update, and O(C + max(|R_t|, D) + T) work
space for D distinct ids. Each entry costs O(1) list operations, each pop removes a node
inserted earlier (at most 2L + k in all), and ``top`` only rises on insertion, by at most T
per step, so its downward scans total O(T^2) (T is the superbatch length, a few thousand at
most, against L in the millions). ``CachePlanner`` keeps the scratch between calls and resets
only the entries it touched, so a superbatch costs nothing per graph node. Measured on a busy
2-core machine, 8.3M entries, T = 500, 2M nodes, Zipf-like ids: 0.7-0.8 s with C = 200k
(85-100 ns per entry, memory latency bound), 1.1-1.4 s with C = 2M (every access a hit).

Optimality
----------
For an access of v at iteration t with previous access p (or p = -1 for its first access),
call [p+1, t] its reuse interval. v cannot enter the cache at any s in (p+1, t], because only
ids of R_{s-1} can enter S_s, so the access hits if and only if v is in S_s for every s in
[p+1, t]. A schedule's hits are thus a family of intervals covering each point at most C
times (S_s holds at most C ids; one id's intervals are disjoint), and conversely every such
family is realised by caching each id over its chosen intervals (an interval starts at p+1,
right after v was in the batch, or at 0 through the fill). Maximising hits is therefore the
maximum C-colourable subfamily of intervals, which the greedy sweep solves (Carlisle & Lloyd
1995; Faigle & Nawijn 1995): at each s take in the intervals starting at s, and while more
than C contain s, discard the one that ends last. That sweep is this algorithm: at s = t+1 the
live intervals are the cached ids (they end at their next access) and the new candidates of
R_t, and at s = 0 the first-access intervals, i.e. the fill.

Why the sweep is optimal, with any tie-break: let O be an optimal family and s the first step
at which the sweep discards an interval J of O. Every interval of O live at s was kept so
far, so O has at most C of the live intervals P, and some K in P \\ O is kept at s, with
end(K) <= end(J) since J ends last. O' = O - J + K is feasible: before s, K was kept beside all
of O's live intervals by a sweep that never exceeds C; from s to end(K), K replaces J, which
is live there. |O'| = |O|, and O' has fewer intervals discarded at s; repeating ends with an
optimal family the sweep never discards from, i.e. contained in the sweep's own. The argument
used only end(K) <= end(J), so every tie-break reaches the same (optimal) miss count. The ties
chosen here: a pending id goes before a cached one (a bypass costs no copy; at the fill it
keeps the prior and costs no read).

Without prefetch (``prefetch=False``)
------------------------------------
A cache that only a batch can feed (the trainer's cache: rows reach it only inside the batches
the loader ships) has no fill step: S_0 = the prior's ids, kept as they are (those the
superbatch never accesses are stale and refilled first), ``num_fill`` = 0, and rows enter only
through the per-iteration updates. Belady stays optimal in this demand model: the argument
above holds unchanged with the first-access intervals of ids outside the prior removed from
the family (they have no way in), and the prior's first-access intervals, at most C of them,
are all taken at s = 0, as the sweep does. The kernel runs the same sweep with an empty batch
at the fill step.

One difference in what enters: without a fill step, the next superbatch can only hit on what
this one leaves behind, so a missed id that is not accessed again in this superbatch is still
inserted when a slot would otherwise stay free (its interval ends at "never", the last bucket,
at the head, so it is the first dropped when room runs out and never displaces an id accessed
again, nor a stale one). Misses within the superbatch are the same as without those
insertions; a cache of num_nodes rows then ships each row once in all.

Not minimised: misses + fill reads together. The fill follows the model (C earliest first
accesses), which may read a row whose hit another optimal schedule gets from a prior id.
"""

import threading
from dataclasses import dataclass, field

import numpy as np

from loader.caches.changeset_kernels import (
    STATUS_DUPLICATE_ID,
    STATUS_ID_OUT_OF_RANGE,
    STATUS_INTERNAL,
    STATUS_OK,
    STATUS_PRIOR_DUPLICATE_ID,
    STATUS_PRIOR_DUPLICATE_SLOT,
    STATUS_PRIOR_ID_OUT_OF_RANGE,
    STATUS_PRIOR_SLOT_OUT_OF_RANGE,
    plan_kernel,
)
from loader.sampling.sampling import as_int

__all__ = ["CacheState", "ChangeSet", "CachePlan", "CachePlanner", "plan_cache"]

_INT32_LIMIT = 2**31 - 1


def _int64_array(field: str, value: object) -> np.ndarray:
    """``value`` as a C-contiguous 1-D int64 array; an array already so is returned uncopied."""
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.ndim != 1:
        raise ValueError(f"{field}: expected a 1-D array, got shape {array.shape}")
    if array.size == 0 and array.dtype.kind not in "iu":
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{field}: expected an integer array, got dtype {array.dtype}")
    if array.dtype != np.int64:
        if not np.can_cast(array.dtype, np.int64, "safe") and array.size and array.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{field}: value {array.max()} does not fit in int64")
        array = array.astype(np.int64)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def _check_int64(field: str, array: np.ndarray, length: int) -> None:
    if not isinstance(array, np.ndarray) or array.dtype != np.int64 or array.shape != (length,):
        raise ValueError(f"{field}: {getattr(array, 'dtype', type(array))} {getattr(array, 'shape', '')}, "
                         f"expected int64 ({length},)")


@dataclass(frozen=True)
class CacheState:
    """Which id each occupied cache slot holds: ``ids[k]`` sits in slot ``slots[k]``.

    ids, slots: int64 [k] (other integer dtypes are converted), equal lengths. Distinctness and
    ranges depend on the cache and are checked by ``plan_cache``. ``CacheState()`` is empty.
    """

    ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    slots: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def __post_init__(self) -> None:
        ids = _int64_array("ids", self.ids)
        slots = _int64_array("slots", self.slots)
        if ids.shape != slots.shape:
            raise ValueError(f"slots: length {len(slots)}, expected one per id = {len(ids)}")
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "slots", slots)

    def __len__(self) -> int:
        return len(self.ids)

    def same_as(self, other: "CacheState") -> bool:
        """The same id in the same slot for every occupied slot, in any order."""
        if len(self) != len(other):
            return False
        mine, theirs = np.argsort(self.slots), np.argsort(other.slots)
        return bool(np.array_equal(self.slots[mine], other.slots[theirs])
                    and np.array_equal(self.ids[mine], other.ids[theirs]))


@dataclass(frozen=True)
class ChangeSet:
    """One iteration's cache update (views into a ``CachePlan``), in Ginex's terms.

    in_ids: int64 [u], ids entering the cache; in_positions: int64 [u], their rows in the
    iteration's batch buffer; slots: int64 [u], the slot each enters; out_ids: int64 [u], the id
    each replaces, -1 where the slot was free.
    """

    in_ids: np.ndarray
    out_ids: np.ndarray
    in_positions: np.ndarray
    slots: np.ndarray


@dataclass(frozen=True)
class CachePlan:
    """Belady's plan for one superbatch: the fill, the hits, the per-iteration updates, the final state.

    The format is in the module docstring. capacity: C; num_nodes: the id range; trace_ptr:
    int64 [T+1] and trace_ids: int64 [L], the trace as given (kept, not copied: do not modify);
    hit_slot: int32 (int64 when C >= 2^31-1) [L]; fill_*: int64 [F]; update_ptr: int64 [T+1];
    update_*, evicted_ids: int64 [U]; final_*: int64; prior: the state the plan starts from.
    The constructor checks dtypes and shapes (O(1)); values are trusted as ``plan_cache``
    made them.
    """

    capacity: int
    num_nodes: int
    trace_ptr: np.ndarray
    trace_ids: np.ndarray
    hit_slot: np.ndarray
    fill_ids: np.ndarray
    fill_slots: np.ndarray
    fill_evicted_ids: np.ndarray
    update_ptr: np.ndarray
    update_slots: np.ndarray
    update_positions: np.ndarray
    update_ids: np.ndarray
    evicted_ids: np.ndarray
    final_ids: np.ndarray
    final_slots: np.ndarray
    prior: CacheState
    num_hits: int
    num_misses: int

    def __post_init__(self) -> None:
        num_iters = len(self.trace_ptr) - 1
        if num_iters < 0:
            raise ValueError("trace_ptr: length 0, expected T+1 >= 1 entries")
        _check_int64("trace_ptr", self.trace_ptr, num_iters + 1)
        length = len(self.trace_ids)
        _check_int64("trace_ids", self.trace_ids, length)
        if int(self.trace_ptr[-1]) != length:
            raise ValueError(f"trace_ptr: last entry {self.trace_ptr[-1]}, expected len(trace_ids) = {length}")
        if self.hit_slot.dtype not in (np.int32, np.int64) or self.hit_slot.shape != (length,):
            raise ValueError(f"hit_slot: {self.hit_slot.dtype} {self.hit_slot.shape}, expected int32/int64 ({length},)")
        for name in ("fill_ids", "fill_slots", "fill_evicted_ids"):
            _check_int64(name, getattr(self, name), len(self.fill_ids))
        if len(self.fill_ids) > self.capacity:
            raise ValueError(f"fill_ids: {len(self.fill_ids)} rows, more than capacity = {self.capacity}")
        _check_int64("update_ptr", self.update_ptr, num_iters + 1)
        num_updates = int(self.update_ptr[-1])
        for name in ("update_slots", "update_positions", "update_ids", "evicted_ids"):
            _check_int64(name, getattr(self, name), num_updates)
        for name in ("final_ids", "final_slots"):
            _check_int64(name, getattr(self, name), len(self.final_ids))
        if not isinstance(self.prior, CacheState):
            raise ValueError(f"prior: expected a CacheState, got {type(self.prior).__name__}")
        if self.num_hits + self.num_misses != length:
            raise ValueError(f"num_hits + num_misses = {self.num_hits} + {self.num_misses}, expected L = {length}")

    @property
    def num_iterations(self) -> int:
        """T."""
        return len(self.trace_ptr) - 1

    @property
    def num_fill(self) -> int:
        """Rows read into the cache before iteration 0."""
        return len(self.fill_ids)

    @property
    def num_updates(self) -> int:
        """Rows copied from batch buffers into the cache over the superbatch."""
        return len(self.update_slots)

    @property
    def final_state(self) -> CacheState:
        """The cache after iteration T-1: pass it as ``prior`` when planning the next superbatch."""
        return CacheState(self.final_ids, self.final_slots)

    def _check_iteration(self, t: int) -> int:
        t = as_int("t", t)
        if not 0 <= t < self.num_iterations:
            raise IndexError(f"iteration {t} outside [0, {self.num_iterations})")
        return t

    def ids(self, t: int) -> np.ndarray:
        """R_t, in batch order (a view)."""
        t = self._check_iteration(t)
        return self.trace_ids[self.trace_ptr[t]:self.trace_ptr[t + 1]]

    def hit_slots(self, t: int) -> np.ndarray:
        """Per id of R_t, the slot to copy its row from, or -1 for a miss (a view)."""
        t = self._check_iteration(t)
        return self.hit_slot[self.trace_ptr[t]:self.trace_ptr[t + 1]]

    def changeset(self, t: int) -> ChangeSet:
        """The update applied after the gather of iteration t."""
        t = self._check_iteration(t)
        updates = slice(int(self.update_ptr[t]), int(self.update_ptr[t + 1]))
        return ChangeSet(in_ids=self.update_ids[updates], out_ids=self.evicted_ids[updates],
                         in_positions=self.update_positions[updates], slots=self.update_slots[updates])


_ERRORS = {
    STATUS_ID_OUT_OF_RANGE: "trace_ids: entry {0} holds id {1}, outside [0, num_nodes = {num_nodes})",
    STATUS_DUPLICATE_ID: "trace_ids: id {1} occurs twice in iteration {0}",
    STATUS_PRIOR_ID_OUT_OF_RANGE: "prior.ids: entry {0} holds id {1}, outside [0, num_nodes = {num_nodes})",
    STATUS_PRIOR_SLOT_OUT_OF_RANGE: "prior.slots: entry {0} holds slot {1}, outside [0, capacity = {capacity})",
    STATUS_PRIOR_DUPLICATE_ID: "prior.ids: id {1} occurs twice (again at entry {0})",
    STATUS_PRIOR_DUPLICATE_SLOT: "prior.slots: slot {1} occurs twice (again at entry {0})",
}


class CachePlanner:
    """Plans superbatch after superbatch for one cache (``capacity`` rows) over ids in [0, num_nodes).

    Holds the num_nodes-sized scratch between calls (int32 while capacity < 2^31-1), all -1
    outside ``plan``, so a plan costs O(its trace), not O(num_nodes). ``plan`` calls are
    serialised by a lock; the kernel releases the GIL.
    """

    def __init__(self, num_nodes: int, capacity: int) -> None:
        self.num_nodes = as_int("num_nodes", num_nodes)
        self.capacity = as_int("capacity", capacity)
        if self.num_nodes < 0:
            raise ValueError(f"num_nodes: {self.num_nodes} is negative")
        if self.capacity < 0:
            raise ValueError(f"capacity: {self.capacity} is negative")
        self._small = self.capacity < _INT32_LIMIT
        self._scratch = np.full(self.num_nodes, -1, dtype=np.int32 if self._small else np.int64)
        self._lock = threading.Lock()

    @property
    def scratch_bytes(self) -> int:
        """Bytes of the num_nodes-sized scratch this planner holds between calls."""
        return int(self._scratch.nbytes)

    def plan(self, trace_ptr: np.ndarray, trace_ids: np.ndarray, prior: CacheState | None = None, *,
             prefetch: bool = True) -> CachePlan:
        """Belady's plan for the trace ``trace_ids[trace_ptr[t]:trace_ptr[t+1]]`` = R_t, t < T.

        prefetch: True (default) plans the fill step (rows read into the cache before iteration
        0); False plans a cache fed only by the batches (no fill, ``num_fill`` = 0; see the
        module docstring).

        trace_ptr: [T+1] from 0 to len(trace_ids), non-decreasing; trace_ids: ids in
        [0, num_nodes), distinct within an iteration; prior: the state the cache is in (default
        empty), ids distinct in [0, num_nodes), slots distinct in [0, capacity). Integer arrays
        are converted to int64 where lossless (an int64 contiguous ``trace_ids`` is kept, not
        copied). Raises ValueError naming the field and the value for any violation.
        """
        ptr = _int64_array("trace_ptr", trace_ptr)
        ids = _int64_array("trace_ids", trace_ids)
        if len(ptr) == 0:
            raise ValueError("trace_ptr: length 0, expected T+1 >= 1 entries")
        if ptr[0] != 0:
            raise ValueError(f"trace_ptr: first entry is {ptr[0]}, expected 0")
        if ptr[-1] != len(ids):
            raise ValueError(f"trace_ptr: last entry is {ptr[-1]}, expected len(trace_ids) = {len(ids)}")
        steps = np.diff(ptr)
        if steps.size and steps.min() < 0:
            t = int(np.argmax(steps < 0))
            raise ValueError(f"trace_ptr: decreases at iteration {t} ({ptr[t]} then {ptr[t + 1]})")
        num_iters = len(ptr) - 1
        if self._small and num_iters >= _INT32_LIMIT:
            raise ValueError(f"trace_ptr: {num_iters} iterations, at most {_INT32_LIMIT - 1} supported")
        if prior is None:
            prior = CacheState()
        if not isinstance(prior, CacheState):
            raise ValueError(f"prior: expected a CacheState, got {type(prior).__name__}")
        if len(prior) > self.capacity:
            raise ValueError(f"prior: {len(prior)} ids, more than capacity = {self.capacity}")

        length, capacity = len(ids), self.capacity
        hit_dtype = np.int32 if self._small else np.int64
        next_iter = np.empty(length, dtype=np.int32 if self._small else np.int64)
        hit_slot = np.empty(length, dtype=hit_dtype)
        fill_size = min(capacity, length)
        fill_ids = np.empty(fill_size, dtype=np.int64)
        fill_slots = np.empty(fill_size, dtype=np.int64)
        fill_evicted = np.empty(fill_size, dtype=np.int64)
        update_ptr = np.empty(num_iters + 1, dtype=np.int64)
        # L entries bound the updates; pages never written stay unbacked, so this costs only U.
        update_slots = np.empty(length, dtype=np.int64)
        update_positions = np.empty(length, dtype=np.int64)
        update_ids = np.empty(length, dtype=np.int64)
        evicted_ids = np.empty(length, dtype=np.int64)
        id_of = np.empty(capacity, dtype=np.int64)
        with self._lock:
            status, detail0, detail1, num_fill, num_hits, num_misses, num_updates = plan_kernel(
                ptr, ids, capacity, prior.ids, prior.slots, self._scratch, next_iter, hit_slot, fill_ids,
                fill_slots, fill_evicted, update_ptr, update_slots, update_positions, update_ids, evicted_ids,
                id_of, bool(prefetch))
        if status == STATUS_INTERNAL:
            raise RuntimeError(f"changeset: bucket {detail0} does not hold exactly its {detail1} hits (a bug)")
        if status != STATUS_OK:
            raise ValueError(_ERRORS[status].format(detail0, detail1, num_nodes=self.num_nodes, capacity=capacity))
        order = np.argsort(fill_ids[:num_fill], kind="stable")
        final_slots = np.flatnonzero(id_of >= 0).astype(np.int64)
        return CachePlan(
            capacity=capacity, num_nodes=self.num_nodes, trace_ptr=ptr, trace_ids=ids, hit_slot=hit_slot,
            fill_ids=fill_ids[order], fill_slots=fill_slots[order], fill_evicted_ids=fill_evicted[order],
            update_ptr=update_ptr, update_slots=update_slots[:num_updates],
            update_positions=update_positions[:num_updates], update_ids=update_ids[:num_updates],
            evicted_ids=evicted_ids[:num_updates], final_ids=id_of[final_slots], final_slots=final_slots,
            prior=prior, num_hits=int(num_hits), num_misses=int(num_misses))


def plan_cache(trace_ptr: np.ndarray, trace_ids: np.ndarray, capacity: int, num_nodes: int,
               prior: CacheState | None = None, *, prefetch: bool = True) -> CachePlan:
    """``CachePlanner(num_nodes, capacity).plan(trace_ptr, trace_ids, prior, prefetch=prefetch)``: one plan,
    O(num_nodes) scratch.

    Use a ``CachePlanner`` to plan many superbatches without allocating the scratch each time.
    """
    return CachePlanner(num_nodes, capacity).plan(trace_ptr, trace_ids, prior, prefetch=prefetch)
