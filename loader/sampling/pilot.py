"""A pilot of sampled batches: the sizes a few real batches have, before anything is served."""

import numpy as np

from loader.format.dataset import Dataset
from loader.sampling.inmemory import epoch_batches_inmemory
from loader.sampling.sampling import CSCGraph, SampledPass, sample_pass

__all__ = ["dataset_csc", "first_epoch_batches", "pilot_nodes_per_hop"]


def dataset_csc(dataset: Dataset, *, mapped: bool) -> CSCGraph:
    """``dataset``'s graph for the in-memory sampler: ``indptr`` read, ``indices`` memory-mapped (``mapped``) or
    read whole, dataset ids as the global ids."""
    return CSCGraph(dataset.read("indptr", np.int64, 1),
                    np.load(dataset.file("indices"), mmap_mode="r" if mapped else None),
                    np.arange(dataset.manifest.num_nodes, dtype=np.int64))


def first_epoch_batches(dataset: Dataset, graph: CSCGraph, batches: int, batch_size: int, fanouts: list[int],
                        seed: int) -> tuple[SampledPass | None, int]:
    """(the first ``batches`` training batches of epoch 0 sampled over ``graph``, how many there are): the
    in-memory epoch's seeds and keys, which every full-graph mode samples alike. None where there is none."""
    plan = epoch_batches_inmemory(np.load(dataset.file("train")), batch_size, seed, 0)
    count = min(batches, len(plan.keys))
    if count == 0:
        return None, 0
    return sample_pass(graph, plan.seeds[:count * batch_size], batch_size, fanouts, plan.keys[:count]), count


def pilot_nodes_per_hop(dataset: Dataset, batch_size: int, fanouts: tuple[int, ...], batches: int = 8,
                        seed: int = 0) -> list[float]:
    """Mean sampled nodes per hop of the first ``batches`` training batches of epoch 0 (the in-memory sampler
    over the memory-mapped graph): what ``aggregation_bytes`` needs to say whether the cache pays."""
    sampled, _ = first_epoch_batches(dataset, dataset_csc(dataset, mapped=True), batches, batch_size, list(fanouts),
                                     seed)
    if sampled is None:
        return [0.0] * (len(fanouts) + 1)
    return [float(v) for v in sampled.num_sampled_nodes.mean(axis=0)]
