"""Betty's REG + METIS on a sampled batch, in numpy: the daemon groups a batch's seeds for a trainer that cuts it into
micro-batches (``Hello.micro_batches``), so the trainer does not run METIS on its training path.

REG (Betty, seed 004, "redundancy-embedded graph") joins two seeds by the number of distinct inputs they share at
hop 1 (a seed counts as its own input): A A^T over the seeds, A[s, v] = 1 where v was sampled as a neighbour of s.
METIS (``pymetis``, seeded) cuts it into ``k`` balanced groups sharing as few inputs as possible.
``trainer.micro_batches.reg_groups`` computes the same groups with torch's sparse product on the trainer's side;
both build the same CSR (rows in seed order, columns ascending), so METIS returns the same membership
(``tests/loader/sampling/test_seed_groups.py``).
"""

import numpy as np

__all__ = ["reg_graph", "reg_groups"]


def reg_graph(hop1_edges: np.ndarray, seeds: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xadj, adjncy, weights) of REG over ``seeds`` seeds: rows in seed order, each row's columns ascending, no
    self-loop. ``hop1_edges``: int (2, E1), the batch's hop-1 edges (row 0 the sampled neighbour's local position,
    row 1 the seed's)."""
    src, dst = np.asarray(hop1_edges[0], dtype=np.int64), np.asarray(hop1_edges[1], dtype=np.int64)
    own = np.arange(seeds, dtype=np.int64)
    # A's nonzeros as distinct (seed, input) pairs, grouped by input
    pairs = np.unique(np.concatenate([src, own]) * seeds + np.concatenate([dst, own]))
    inputs, members = pairs // seeds, pairs % seeds
    starts = np.flatnonzero(np.r_[True, inputs[1:] != inputs[:-1]])
    sizes = np.diff(np.r_[starts, len(inputs)])
    # every ordered pair of seeds sharing an input: element e of a group of g pairs with each of the group's g
    size_of = np.repeat(sizes, sizes)
    left = np.repeat(np.arange(len(inputs), dtype=np.int64), size_of)
    group_start = np.repeat(np.repeat(starts, sizes), size_of)
    within = np.arange(len(left), dtype=np.int64) - np.repeat(np.cumsum(size_of) - size_of, size_of)
    i, j = members[left], members[group_start + within]
    keys, weights = np.unique(i * seeds + j, return_counts=True)
    i, j = keys // seeds, keys % seeds
    off = i != j
    i, j, weights = i[off], j[off], weights[off].astype(np.int64)
    xadj = np.zeros(seeds + 1, dtype=np.int64)
    np.cumsum(np.bincount(i, minlength=seeds), out=xadj[1:])
    return xadj, j, weights


def reg_groups(hop1_edges: np.ndarray, seeds: int, k: int, seed: int = 0) -> np.ndarray:
    """int32 (seeds,): each seed's group, 0..k-1 (k capped at the seeds; all 0 for k <= 1)."""
    import pymetis  # imported here: a daemon whose clients cut no batch never loads it

    k = max(1, min(k, seeds))
    if k == 1:
        return np.zeros(seeds, dtype=np.int32)
    xadj, adjncy, weights = reg_graph(hop1_edges, seeds)
    _, membership = pymetis.part_graph(k, adjacency=pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy),
                                       eweights=weights, options=pymetis.Options(seed=seed))
    return np.asarray(membership, dtype=np.int32)
