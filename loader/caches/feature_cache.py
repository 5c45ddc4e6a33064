"""The executor of ``loader.caches.changeset`` plans: a RAM cache of feature rows kept Belady-optimal.

Per superbatch, with a ``CachePlan`` from ``loader.caches.changeset``::

    cache.fill(plan, read_rows)                 # rows of fill_ids read straight into their slots
    for t in range(plan.num_iterations):
        cache.gather(plan, t, x, read_rows)     # x: the batch's (|R_t|, D) buffer, e.g. a shm slot

``gather`` (1) copies the hit rows from their slots into x, (2) has ``read_rows`` write the
miss rows straight into their rows of x, (3) copies the rows named by the iteration's update
from x into their slots. Every copy is a numba kernel, row by row, without a temporary, and
releases the GIL. The cache checks that plans are applied in order and chained: a plan's prior
must be the state the previous plan left (or empty after ``reset``), since a plan applied to the
wrong state would hand out wrong rows silently.
"""

from typing import Protocol

import numpy as np
import numpy.typing as npt

from loader.caches.changeset import CachePlan, CacheState
from loader.caches.changeset_kernels import copy_hit_rows, copy_rows

__all__ = ["RowFetcher", "ArrayRowFetcher", "FeatureCache", "row_words"]


class RowFetcher(Protocol):
    """Writes feature rows into place: row of ``ids[k]`` into ``out[positions[k]]`` for every k.

    ids: int64, ascending for a fill (file order), batch order for misses; positions: int64,
    distinct; out: the cache's rows (fill) or the batch buffer (misses), written in place.
    """

    def __call__(self, ids: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None: ...


def row_words(rows: np.ndarray) -> np.ndarray:
    """A 2-D C-contiguous array as unsigned words of its item size, so copies are bit-exact for any dtype."""
    itemsize = rows.dtype.itemsize
    word = np.dtype(f"u{itemsize}") if itemsize in (1, 2, 4, 8) else np.dtype(np.uint8)
    return rows.view(word)


class ArrayRowFetcher:
    """A ``RowFetcher`` over a (num_nodes, D) array in memory or memory-mapped; counts ``rows_read``."""

    def __init__(self, features: np.ndarray) -> None:
        if not isinstance(features, np.ndarray) or features.ndim != 2 or not features.flags.c_contiguous:
            raise ValueError(f"features: expected a C-contiguous 2-D array, got {type(features).__name__} "
                             f"{getattr(features, 'shape', '')}")
        self.features = features.view(np.ndarray)  # a memmap as a plain array: numba types it directly
        self.rows_read = 0

    def __call__(self, ids: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        if ids.shape != positions.shape:
            raise ValueError(f"positions: shape {positions.shape}, expected one per id {ids.shape}")
        if out.dtype != self.features.dtype or out.shape[1:] != self.features.shape[1:] or not out.flags.c_contiguous:
            raise ValueError(f"out: {out.dtype} rows of {out.shape[1:]}, expected C-contiguous "
                             f"{self.features.dtype} rows of {self.features.shape[1:]}")
        if ids.size:
            if ids.min() < 0 or ids.max() >= len(self.features):
                raise ValueError(f"ids: outside [0, {len(self.features)})")
            if positions.min() < 0 or positions.max() >= len(out):
                raise ValueError(f"positions: outside [0, {len(out)})")
        copy_rows(row_words(self.features), ids, row_words(out), positions)
        self.rows_read += len(ids)


class FeatureCache:
    """``capacity`` feature rows of one dtype and width, managed by ``CachePlan`` after ``CachePlan``.

    rows: a C-contiguous (C, D) array the cache owns from now on (``FeatureCache.empty`` allocates
    one; shared memory works too). Not thread-safe: one ``fill``/``gather`` at a time, in order.
    """

    def __init__(self, rows: np.ndarray) -> None:
        if not isinstance(rows, np.ndarray) or rows.ndim != 2 or not rows.flags.c_contiguous:
            raise ValueError(f"rows: expected a C-contiguous 2-D array, got {type(rows).__name__} "
                             f"{getattr(rows, 'shape', '')}")
        self.rows = rows
        self._words = row_words(rows)
        self._state: CacheState | None = CacheState()  # None: unknown, after a fill that failed
        self._plan: CachePlan | None = None
        self._next = 0

    @classmethod
    def empty(cls, capacity: int, dim: int, dtype: npt.DTypeLike) -> "FeatureCache":
        """A cache of ``capacity`` rows of ``dim`` items of ``dtype``, starting empty."""
        if capacity < 0 or dim < 0:
            raise ValueError(f"capacity, dim: {capacity}, {dim}, expected >= 0")
        return cls(np.empty((capacity, dim), dtype=dtype))

    @property
    def capacity(self) -> int:
        return len(self.rows)

    @property
    def state(self) -> CacheState:
        """The ids in the slots once the current plan is done (or ready to fill): a next plan's prior."""
        if self._plan is not None and self._next < self._plan.num_iterations:
            raise RuntimeError(f"state: the current plan is at iteration {self._next} of "
                               f"{self._plan.num_iterations}")
        if self._state is None:
            raise RuntimeError("state: unknown after a fill that failed; reset()")
        return self._state

    def reset(self) -> None:
        """Forget the contents (after an abandoned plan, say): the next plan must start from an empty prior."""
        self._state = CacheState()
        self._plan = None
        self._next = 0

    def fill(self, plan: CachePlan, read_rows: RowFetcher) -> None:
        """Start ``plan``: read its fill rows straight into their slots."""
        if plan.capacity != self.capacity:
            raise ValueError(f"plan: capacity {plan.capacity}, this cache has {self.capacity} rows")
        if self._plan is not None and self._next < self._plan.num_iterations:
            raise ValueError(f"plan: the current plan is at iteration {self._next} of "
                             f"{self._plan.num_iterations}; finish it or reset()")
        if self._state is None:
            raise ValueError("plan: the cache's contents are unknown after a fill that failed; reset()")
        if not plan.prior.same_as(self._state):
            raise ValueError(f"plan: its prior ({len(plan.prior)} ids) is not this cache's state "
                             f"({len(self._state)} ids); plan from cache.state, or reset()")
        # Until the reads complete the slots hold neither the prior nor the plan's state.
        self._plan = None
        self._state = None
        if plan.num_fill:
            read_rows(plan.fill_ids, plan.fill_slots, self.rows)
        self._plan = plan
        self._next = 0
        self._state = plan.final_state

    def gather(self, plan: CachePlan, t: int, x: np.ndarray, read_rows: RowFetcher) -> None:
        """Iteration t of ``plan``: fill x (|R_t|, D) with the rows of ``plan.ids(t)``, then update the cache.

        Iterations run in order after ``fill(plan)``; x must have the cache's dtype and width
        and be C-contiguous (it is written in place, never copied). If ``read_rows`` raises, the
        cache is as before the call and iteration t can be retried.
        """
        if plan is not self._plan:
            raise ValueError("plan: not the plan this cache was filled for; call fill(plan) first")
        if t != self._next:
            raise ValueError(f"t: {t}, expected the next iteration {self._next} of {plan.num_iterations}")
        begin, end = int(plan.trace_ptr[t]), int(plan.trace_ptr[t + 1])
        if not isinstance(x, np.ndarray) or x.dtype != self.rows.dtype or x.shape != (end - begin, self.rows.shape[1]):
            raise ValueError(f"x: {getattr(x, 'dtype', type(x))} {getattr(x, 'shape', '')}, expected "
                             f"{self.rows.dtype} {(end - begin, self.rows.shape[1])}")
        if not x.flags.c_contiguous:
            raise ValueError("x: not C-contiguous")
        x_words = row_words(x)
        hits = plan.hit_slot[begin:end]
        copy_hit_rows(self._words, hits, x_words)
        miss_positions = np.flatnonzero(hits < 0)
        if miss_positions.size:
            read_rows(plan.trace_ids[begin:end][miss_positions], miss_positions, x)
        updates = slice(int(plan.update_ptr[t]), int(plan.update_ptr[t + 1]))
        copy_rows(x_words, plan.update_positions[updates], self._words, plan.update_slots[updates])
        self._next = t + 1
