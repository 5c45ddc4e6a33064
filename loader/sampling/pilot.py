"""A pilot of sampled batches: the sizes a few real batches have, before anything is served."""

from collections.abc import Sequence

import numpy as np

from loader.format.dataset import Dataset
from loader.sampling.inmemory import epoch_batches_inmemory
from loader.sampling.sampling import CSCGraph, SampledPass, sample_pass

__all__ = ["dataset_csc", "first_batches", "first_epoch_batches", "mean_nodes_per_hop", "pilot_nodes_per_hop"]


def dataset_csc(dataset: Dataset, *, mapped: bool) -> CSCGraph:
    """``dataset``'s graph for the in-memory sampler: ``indptr`` read, ``indices`` memory-mapped (``mapped``) or
    read whole, dataset ids as the global ids."""
    return CSCGraph(dataset.read("indptr", np.int64, 1),
                    np.load(dataset.file("indices"), mmap_mode="r" if mapped else None),
                    np.arange(dataset.manifest.num_nodes, dtype=np.int64))


def first_batches(graph: CSCGraph, train_ids: np.ndarray, batches: int, batch_size: int, fanouts: Sequence[int],
                  seed: int) -> tuple[SampledPass | None, int]:
    """(the first ``batches`` training batches of epoch 0 sampled over ``graph``, how many there are): the
    in-memory epoch's seeds and keys over ``train_ids``, which every full-graph mode samples alike. None where
    there is none."""
    plan = epoch_batches_inmemory(train_ids, batch_size, seed, 0)
    count = min(batches, len(plan.keys))
    if count == 0:
        return None, 0
    return sample_pass(graph, plan.seeds[:count * batch_size], batch_size, tuple(fanouts), plan.keys[:count]), count


def first_epoch_batches(dataset: Dataset, graph: CSCGraph, batches: int, batch_size: int, fanouts: Sequence[int],
                        seed: int) -> tuple[SampledPass | None, int]:
    """``first_batches`` over ``dataset``'s training split."""
    return first_batches(graph, np.load(dataset.file("train")), batches, batch_size, fanouts, seed)


def mean_nodes_per_hop(graph: CSCGraph, train_ids: np.ndarray, batches: int, batch_size: int,
                       fanouts: Sequence[int], seed: int = 0) -> list[float] | None:
    """Mean sampled nodes per hop (seeds first) of the first ``batches`` training batches of epoch 0 over
    ``graph``: what ``aggregation_bytes`` needs to say whether the cache pays. None without a training batch."""
    sampled, _ = first_batches(graph, train_ids, batches, batch_size, fanouts, seed)
    return None if sampled is None else [float(v) for v in sampled.num_sampled_nodes.mean(axis=0)]


def pilot_nodes_per_hop(dataset: Dataset, batch_size: int, fanouts: tuple[int, ...], batches: int = 8,
                        seed: int = 0) -> list[float]:
    """``mean_nodes_per_hop`` of the in-memory sampler over ``dataset``'s memory-mapped graph (zeros without a
    training batch)."""
    hops = mean_nodes_per_hop(dataset_csc(dataset, mapped=True), np.load(dataset.file("train")), batches, batch_size,
                              fanouts, seed)
    return [0.0] * (len(fanouts) + 1) if hops is None else hops
