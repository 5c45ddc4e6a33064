"""Stage 5, the publisher: gather each batch into a free shared-memory slot and announce it.

A slot holds one batch: ``n_id`` (dataset ids), ``x`` (feature rows, gathered straight from the
arena or the memory-mapped file into the slot: no intermediate copy), ``y`` (seed labels),
``edge_index`` and the per-hop counts. ``SlotFlow`` is the credit/slot bookkeeping of one client:
a batch goes out only when the client has credit and a slot is free, so in-flight batches are
capped by the slots and a slow trainer stalls the whole pipeline through the bounded queues.
"""

import asyncio

import numpy as np

from loader.daemon.aggregate_rows import AggregateFill
from loader.daemon.slot_source import SlotSource
from loader.sampling.sampling import SampledBatch, SampledBatches
from loader.sampling.seed_groups import reg_groups
from proto.batch_arrays import BatchShape, OpenBatch, open_batch
from proto.errors import SlotOverflow
from proto.messages import BatchId
from proto.slots import SlotRing

__all__ = ["SlotFlow", "open_slot", "fill_slot", "overflow_message"]


class SlotFlow:
    """Credits and free slots of one session (all methods run on the event loop; one waiter)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._free = list(range(count - 1, -1, -1))
        self._in_use: dict[int, int] = {}
        self._credit = 0
        self._changed = asyncio.Event()
        self.closed = False

    @property
    def in_use(self) -> int:
        return len(self._in_use)

    async def acquire(self, seq: int) -> int:
        """Wait for a credit and a free slot; the slot is then owned by batch ``seq``."""
        while not (self.closed or (self._credit > 0 and self._free)):
            self._changed.clear()
            await self._changed.wait()
        if self.closed:
            raise ConnectionError("client gone")
        self._credit -= 1
        slot = self._free.pop()
        self._in_use[slot] = seq
        return slot

    def abandon(self, slot: int) -> None:
        """Give back a slot acquired for a batch that was never announced (and its credit)."""
        self._in_use.pop(slot, None)
        self._free.append(slot)
        self._credit += 1
        self._changed.set()

    def grant(self, count: int) -> None:
        self._credit += count
        self._changed.set()

    def release(self, slot: int, seq: int) -> str | None:
        """Free ``slot``; returns an error text when the client releases what it does not hold."""
        if self._in_use.get(slot) != seq:
            return f"release of slot {slot} seq {seq}, which the client does not hold"
        del self._in_use[slot]
        self._free.append(slot)
        self._credit += 1
        self._changed.set()
        return None

    def close(self) -> None:
        self.closed = True
        self._changed.set()


def open_slot(ring: SlotRing, slot: int, batch: SampledBatch, b: int, num_hops: int, source: SlotSource, *,
              ids: np.ndarray | None = None, shipped_rows: int | None = None, num_updates: int = 0,
              aggregates: AggregateFill | None = None, micro_batches: int = 0) -> OpenBatch:
    """Lay ``batch`` (batch ``b`` of its pass) out in ``slot`` and write all of it but its rows (``x``) and a client
    cache's arrays: ``n_id`` (``ids``, or ``source``'s for its nodes), the seeds' labels, the edges, the per-hop
    counts, the source's class weights where it has them, with ``aggregates`` each node's aggregation cache row
    (``x_agg``: from the source where it holds them, else read by dataset id) and with ``micro_batches`` above 1
    its seeds' REG + METIS groups (``seed_group``), and a link-prediction pass's pairs (``SlotSource.link_labels``, with
    their weights where it has them,
    ``eval_pairs``). The caller fills the rest and commits. ``shipped_rows``,
    ``num_updates``: a batch for a client with a feature cache (``BatchShape``). Raises ``SlotOverflow`` when the
    batch does not fit (the caller reports it to the client).

    What every batch carries is written here once, for ``fill_slot`` and ``TrainerCache.fill_slot`` alike.
    """
    nodes = batch.nodes
    seeds = int(batch.num_sampled_nodes[0])
    pairs, pair_index, pair_extra, pair_weight = "", None, None, None
    if source.link_labels is not None:
        pairs, (pair_index, pair_extra) = "train", source.link_labels.batch(b)
        pair_weight = source.link_labels.batch_weight(b)
    elif source.eval_pairs is not None:
        pairs, (pair_index, pair_extra) = "eval", source.eval_pairs.batch(b)
    out = open_batch(ring, slot, BatchShape(len(nodes), seeds, batch.edge_index.shape[1], num_hops,
                                            source.feat_dim, source.feat_dtype, shipped_rows=shipped_rows,
                                            num_updates=num_updates, aggregated=aggregates is not None,
                                            num_classes=0 if source.class_weight is None else len(source.class_weight),
                                            seed_groups=micro_batches > 1, pairs=pairs,
                                            num_pairs=0 if pair_index is None else pair_index.shape[1],
                                            num_tails=pair_extra.shape[1] if pair_extra is not None and pairs == "eval"
                                            else 0, pair_weights=pair_weight is not None))
    arrays = out.arrays
    if pairs == "train":
        assert arrays.edge_label_index is not None and arrays.edge_label is not None
        arrays.edge_label_index[:] = pair_index
        arrays.edge_label[:] = pair_extra
        if pair_weight is not None:
            assert arrays.edge_weight is not None
            arrays.edge_weight[:] = pair_weight
    elif pairs == "eval":
        assert arrays.pair_index is not None and arrays.pair_tails is not None
        arrays.pair_index[:] = pair_index
        arrays.pair_tails[:] = pair_extra
    arrays.n_id[:] = source.global_ids(nodes) if ids is None else ids
    arrays.y[:] = source.labels(nodes[:seeds])
    arrays.edge_index[:] = batch.edge_index
    arrays.nodes_per_hop[:] = batch.num_sampled_nodes
    arrays.edges_per_hop[:] = batch.num_sampled_edges
    if aggregates is not None:
        assert arrays.x_agg is not None
        if source.aggregates is not None:
            source.aggregates.fill(b, nodes, arrays.x_agg)
        else:
            aggregates.fill(arrays.n_id, arrays.x_agg)
    if source.class_weight is not None:
        assert arrays.class_weight is not None
        arrays.class_weight[:] = source.class_weight
    if micro_batches > 1:
        assert arrays.seed_group is not None
        arrays.seed_group[:] = reg_groups(batch.edge_index[:, :int(batch.num_sampled_edges[0])], seeds, micro_batches)
    return out


def fill_slot(ring: SlotRing, slot: int, batch_id: BatchId, sampled: SampledBatches, b: int,
              source: SlotSource, aggregates: AggregateFill | None = None, micro_batches: int = 0) -> int:
    """Write batch ``b`` of ``sampled``, every row, into ``slot`` and commit it; returns payload bytes.

    Raises ``SlotOverflow`` when the batch does not fit (the caller reports it to the client).
    """
    batch = sampled.batch(b)
    out = open_slot(ring, slot, batch, b, sampled.num_hops, source, aggregates=aggregates,
                    micro_batches=micro_batches)
    source.rows.fill(b, batch.nodes, out.arrays.x)
    return out.commit(batch_id)


def overflow_message(err: SlotOverflow) -> str:
    return (f"a batch needs {err.needed:,} bytes but slots hold {err.available:,}; set [publisher] slot_bytes "
            f"to at least {err.needed:,} (or lower batch_size / fanouts)")
