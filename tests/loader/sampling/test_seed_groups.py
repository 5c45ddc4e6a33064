"""loader.sampling.seed_groups: REG against a plain count, and the same METIS groups as the trainer's torch REG."""

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.sampling.seed_groups import reg_graph, reg_groups


def plain_reg(edges: np.ndarray, seeds: int) -> dict[tuple[int, int], int]:
    """Shared distinct inputs of every ordered pair of distinct seeds (a seed its own input)."""
    inputs: dict[int, set[int]] = {s: {s} for s in range(seeds)}
    for v, s in edges.T.tolist():
        inputs[s].add(v)
    return {(a, b): len(inputs[a] & inputs[b]) for a, b in itertools.permutations(range(seeds), 2)
            if inputs[a] & inputs[b]}


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 12), st.integers(0, 20), st.integers(0, 60), st.integers(0, 2**32 - 1))
def test_reg_counts_the_distinct_inputs_two_seeds_share(seeds, others, edges, seed):
    rng = np.random.default_rng(seed)
    hop1 = np.stack([rng.integers(0, seeds + others, edges), rng.integers(0, seeds, edges)])
    xadj, adjncy, weights = reg_graph(hop1, seeds)
    got = Counter()
    for s in range(seeds):
        row = adjncy[xadj[s]:xadj[s + 1]]
        assert (np.diff(row) > 0).all() and s not in row  # ascending, no self-loop
        got.update({(s, int(t)): int(w) for t, w in zip(row, weights[xadj[s]:xadj[s + 1]])})
    assert dict(got) == plain_reg(hop1, seeds)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_the_daemons_groups_are_the_trainers(dataset_1500, k):
    from loader.format.dataset import open_dataset
    from trainer.inmemory_source import InMemorySource
    from trainer.micro_batches import reg_groups as trainer_reg_groups

    source = InMemorySource(open_dataset(dataset_1500), batch_size=256, fanouts=(10, 5), seed=0)
    for batch in itertools.islice(source.train_batches(0), 3):
        seeds = batch.num_sampled_nodes[0]
        hop1 = batch.edge_index[:, :batch.num_sampled_edges[0]].numpy()
        ours = reg_groups(hop1, seeds, k, seed=0)
        assert ours.dtype == np.int32 and ours.shape == (seeds,) and set(ours.tolist()) <= set(range(k))
        assert torch.equal(torch.from_numpy(ours.astype(np.int64)), trainer_reg_groups(batch, k, 0))
