"""The daemon side of a client's feature cache: Belady plans without prefetch, and the slots they shape.

A trainer may keep a cache of feature rows on its training device (``Hello.feature_cache_bytes``).
The daemon then runs, per session, the same Belady plan the exact mode runs for its own RAM
cache (``loader.caches.changeset``), but in the demand model (``prefetch=False``): the trainer's cache
can only take rows out of the batches it receives. Per superbatch (every ``SampledWork``: a pass
over a mega-batch, or a full-graph superbatch) the daemon plans over the dataset ids of its
batches, and each training slot then carries only the missed rows in ``x`` plus the plan
(``hit_slot``, ``upd_slot``, ``upd_pos``); the trainer assembles the full ``x`` and applies the
update (proto/PROTOCOL.md, "Batches for a client with a feature cache").

The daemon never holds the rows: it only mirrors which id sits in which of the client's slots
(the plan's final state, the next plan's prior). Both sides stay in step because batches are
published and assembled strictly in order and every published batch is assembled; a session
that breaks off mid-stream is closed, and a reconnecting client starts empty.

Memory per session with a cache: the planner's scratch, 4 bytes per dataset node (int32 while the
cache has fewer than 2^31-1 rows), held while the session lives; per superbatch the plan's
arrays (about 28 bytes per trace entry, freed after the superbatch); and, only for sources that
cannot gather a subset of a batch (the exact mode, whose own cache plan needs every batch whole),
a scratch buffer of the largest batch's rows.
"""

import logging
from dataclasses import dataclass

import numpy as np

from loader.caches.changeset import CachePlan, CachePlanner, CacheState
from loader.caches.changeset_kernels import copy_rows
from loader.caches.feature_cache import row_words
from loader.daemon.aggregate_rows import AggregateFill
from loader.daemon.publisher import open_slot
from loader.daemon.slot_source import SlotSource
from loader.sampling.sampling import SampledBatches
from proto.messages import BatchId
from proto.slots import SlotRing

__all__ = ["TrainerCache", "accepted_rows", "MAX_ROWS", "CachedSlot"]

log = logging.getLogger("megabatch.trainer_cache")

MAX_ROWS = 2**31 - 2
"""Most rows the daemon plans for: slot numbers and batch positions ship as int32."""


def accepted_rows(requested_bytes: int, num_nodes: int, feat_dim: int, feat_dtype: np.dtype) -> int:
    """Rows of a client cache of ``requested_bytes``: whole rows, at most ``num_nodes`` (more could never
    be used) and ``MAX_ROWS``; 0 when the request is 0 or smaller than a row."""
    row_bytes = feat_dim * np.dtype(feat_dtype).itemsize
    if requested_bytes <= 0 or row_bytes == 0:
        return 0
    return min(requested_bytes // row_bytes, num_nodes, MAX_ROWS)


@dataclass(frozen=True)
class CachedSlot:
    """What one slot for a cached client carried."""

    nbytes: int
    """Payload bytes written."""
    hits: int
    """Rows the client takes from its cache."""
    shipped: int
    """Rows shipped in ``x``."""


class TrainerCache:
    """One session's view of its client's feature cache of ``rows`` rows (``rows`` >= 1).

    ``plan`` runs once per superbatch, before its first batch is published; ``fill_slot`` then
    writes its batches in order. Both run on the CPU pool, one call at a time (the session's
    stream is sequential).
    """

    def __init__(self, num_nodes: int, rows: int, feat_dim: int, feat_dtype: np.dtype) -> None:
        if not 1 <= rows <= MAX_ROWS:
            raise ValueError(f"rows: {rows}, expected 1 to {MAX_ROWS}")
        self.rows = rows
        self._planner = CachePlanner(num_nodes, rows)
        self._state = CacheState()
        self._scratch = np.empty((0, feat_dim), dtype=feat_dtype)

    @property
    def scratch_bytes(self) -> int:
        """Bytes held for the session's lifetime: the planner's per-node scratch and the batch scratch."""
        return self._planner.scratch_bytes + self._scratch.nbytes

    def plan(self, sampled: SampledBatches, source: SlotSource) -> CachePlan:
        """The plan for every batch of ``sampled``, from the state the previous superbatch left."""
        ids = source.global_ids(sampled.nodes)
        plan = self._planner.plan(sampled.node_ptr, ids, self._state, prefetch=False)
        self._state = plan.final_state
        return plan

    def fill_slot(self, ring: SlotRing, slot: int, batch_id: BatchId, sampled: SampledBatches, b: int,
                  source: SlotSource, plan: CachePlan, aggregates: AggregateFill | None = None,
                  micro_batches: int = 0) -> CachedSlot:
        """Write batch ``b`` of ``sampled`` into ``slot`` with only its missed rows in ``x``, and commit (the rest of
        the batch as every slot carries it: ``publisher.open_slot``).

        Raises ``SlotOverflow`` when the batch does not fit.
        """
        batch = sampled.batch(b)
        nodes = batch.nodes
        hits = plan.hit_slots(b)
        miss = np.flatnonzero(hits < 0)
        change = plan.changeset(b)
        # n_id: the dataset ids the plan was made for
        out = open_slot(ring, slot, batch, b, sampled.num_hops, source, ids=plan.ids(b), shipped_rows=len(miss),
                        num_updates=len(change.slots), aggregates=aggregates, micro_batches=micro_batches)
        arrays = out.arrays
        x = arrays.x
        if source.rows.fills_any_subset:
            if len(miss):
                source.rows.fill(b, nodes[miss], x)
        else:
            # The exact mode's own cache must see every batch whole and in order, so gather it into
            # scratch and copy the missed rows out: one extra copy of the batch's rows in RAM.
            scratch = self._scratch_for(len(nodes))
            source.rows.fill(b, nodes, scratch)
            copy_rows(row_words(scratch), miss, row_words(x), np.arange(len(miss), dtype=np.int64))
        assert arrays.hit_slot is not None and arrays.upd_slot is not None and arrays.upd_pos is not None
        arrays.hit_slot[:] = hits
        arrays.upd_slot[:] = change.slots
        arrays.upd_pos[:] = change.in_positions
        nbytes = out.commit(batch_id)
        return CachedSlot(nbytes, len(nodes) - len(miss), len(miss))

    def _scratch_for(self, num_rows: int) -> np.ndarray:
        if len(self._scratch) < num_rows:
            # grown to the largest batch seen, then reused: a slot's worth of rows at most
            self._scratch = np.empty((num_rows, self._scratch.shape[1]), dtype=self._scratch.dtype)
        return self._scratch[:num_rows]
