"""A pilot of sampled batches: the sizes a few real batches have, before anything is served."""

import numpy as np

from loader.format.dataset import Dataset
from loader.sampling.inmemory import epoch_batches_inmemory
from loader.sampling.sampling import CSCGraph, sample_pass

__all__ = ["pilot_nodes_per_hop"]


def pilot_nodes_per_hop(dataset: Dataset, batch_size: int, fanouts: tuple[int, ...], batches: int = 8,
                        seed: int = 0) -> list[float]:
    """Mean sampled nodes per hop of the first ``batches`` training batches of epoch 0 (the in-memory sampler
    over the memory-mapped graph): what ``aggregation_bytes`` needs to say whether the cache pays."""
    m = dataset.manifest
    graph = CSCGraph(dataset.read("indptr", np.int64, 1), np.load(dataset.file("indices"), mmap_mode="r"),
                     np.arange(m.num_nodes, dtype=np.int64))
    plan = epoch_batches_inmemory(np.load(dataset.file("train")), batch_size, seed, 0)
    count = min(batches, len(plan.keys))
    if count == 0:
        return [0.0] * (len(fanouts) + 1)
    sampled = sample_pass(graph, plan.seeds[:count * batch_size], batch_size, list(fanouts), plan.keys[:count])
    return [float(v) for v in sampled.num_sampled_nodes.mean(axis=0)]
