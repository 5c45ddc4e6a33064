"""``slot_bytes = "auto"``: size the shared-memory slots from a pilot sample.

Slots are fixed when a client connects, before any mega-batch is loaded. The hard bound
B (1 + f1 + f1 f2 + ...) capped at N is tight for small batches and hopeless for large ones
(a 1024-seed, [10, 5] batch is bounded by 62k nodes but holds a few thousand), so we sample a
few real batches over the full graph (a superset of any mega-batch's neighbourhoods, so
training batches only get smaller), add 50% headroom, and keep the hard bound as a ceiling.
A batch that still does not fit is refused with a message naming the size to configure.
"""

import numpy as np

from loader.config import SamplerConfig
from loader.dataset import Dataset
from loader.eval_stream import open_eval_data
from loader.inmemory import STREAM_VAL, epoch_batches_inmemory, eval_batches_plan
from loader.publisher import batch_specs
from loader.resident import ResidentData
from loader.sampling import sample_pass
from proto.slots import HEADER_BYTES, slot_bytes_for

__all__ = ["estimate_slot_bytes", "pilot_batch_sizes", "PILOT_BATCHES", "HEADROOM"]

PILOT_BATCHES = 16
HEADROOM = 1.5


def _hard_bound(batch_size: int, fanouts: tuple[int, ...], num_nodes: int, num_edges: int) -> tuple[int, int]:
    nodes, edges, frontier = batch_size, 0, batch_size
    for fanout in fanouts:
        if fanout < 0:
            return num_nodes, num_edges
        frontier *= fanout
        edges += frontier
        nodes += frontier
    return min(nodes, num_nodes), min(edges, num_edges)


def pilot_batch_sizes(dataset: Dataset, resident: ResidentData, sampler: SamplerConfig) -> tuple[int, int]:
    """(nodes, edges) a training batch is expected to stay under: pilot max x 1.5, capped by the hard bound."""
    m = dataset.manifest
    plan = epoch_batches_inmemory(resident.split_ids["train"], sampler.batch_size, sampler.seed, 0)
    count = min(PILOT_BATCHES, len(plan.keys))
    bound_nodes, bound_edges = _hard_bound(sampler.batch_size, sampler.fanouts, m.num_nodes, m.num_edges)
    if count == 0:
        return min(bound_nodes, sampler.batch_size), 0
    data = open_eval_data(dataset, resident.partitions)
    try:
        sampled = sample_pass(data.graph, plan.seeds[:count * sampler.batch_size], sampler.batch_size,
                              sampler.fanouts, plan.keys[:count])
    finally:
        data.close()
    return (min(bound_nodes, int(np.diff(sampled.node_ptr).max() * HEADROOM) + 64),
            min(bound_edges, int(np.diff(sampled.edge_ptr).max() * HEADROOM) + 64))


def estimate_slot_bytes(dataset: Dataset, resident: ResidentData, sampler: SamplerConfig) -> int:
    """Bytes per slot that fit every training and evaluation batch with high margin."""
    m = dataset.manifest
    data = open_eval_data(dataset, resident.partitions)
    try:
        worst = 0
        cases = [(epoch_batches_inmemory(resident.split_ids["train"], sampler.batch_size, sampler.seed, 0),
                  sampler.batch_size, sampler.fanouts),
                 (eval_batches_plan(resident.split_ids["val"], sampler.eval_batch_size, sampler.seed, STREAM_VAL),
                  sampler.eval_batch_size, sampler.eval_fanouts)]
        for plan, batch_size, fanouts in cases:
            count = min(PILOT_BATCHES, len(plan.keys))
            if count == 0:
                continue
            sampled = sample_pass(data.graph, plan.seeds[:count * batch_size], batch_size, fanouts, plan.keys[:count])
            sizes = np.diff(sampled.node_ptr)
            edges = np.diff(sampled.edge_ptr)
            bound_nodes, bound_edges = _hard_bound(batch_size, fanouts, m.num_nodes, m.num_edges)
            nodes = min(bound_nodes, int(sizes.max() * HEADROOM) + 64)
            n_edges = min(bound_edges, int(edges.max() * HEADROOM) + 64)
            specs = batch_specs(nodes, min(batch_size, nodes), n_edges, len(fanouts), m.feat_dim,
                                np.dtype(m.feat_dtype.value))
            worst = max(worst, slot_bytes_for(specs, HEADER_BYTES))
        return max(worst, 2 * HEADER_BYTES)
    finally:
        data.close()
