"""What COMET's accuracy gap is made of: three variants of its in-memory emulation, as orders of
``bench/link_bench.py`` (issue 31).

``--link-order comet`` changes three things against the shuffled order at once: the order of the training
edges (bucket by bucket, state by state), the neighbourhoods (sampled in the subgraph the buffer induces) and
the negatives (drawn from the buffer's nodes). Each variant keeps COMET's edge order and states and undoes
one or two of the others, so the difference to COMET says what that part costs:

- ``comet-global-neighbours``: neighbours sampled in the whole graph; negatives still from the buffer;
- ``comet-uniform-negatives``: neighbours in the whole graph and negatives uniform over every node: only the
  order is COMET's;
- ``comet-widened``: a remedy that keeps out-of-core reads small: each state's buffer plus ``WIDEN`` x its
  node count of nodes drawn uniformly from outside it (seeded by sampler seed, epoch and state; out of core
  their rows would be read by id), neighbours in the subgraph that set induces, negatives from all of it;
- ``comet-hybrid-negatives``: the remedy a daemon could serve beside the buffer through the exact path: negatives
  uniform over every node; a resident node's neighbours are its resident ones (COMET's), a node outside the
  buffer has all of its neighbours (out of core its list and row would be read from disk, checked, by id).

- ``comet-source-weighted-negatives``: COMET's batches, each negative's loss weighted as
  ``loader.sampling.negative_weights`` weighs them (the trainer's default for a buffer order), with the source's
  partition alone as the near class: the first form measured, kept for the comparison.

- ``comet-tail-batches``: COMET as it was cut before 2026-11-28, each state into full batches and a short last
  one (``buffer_epoch(balanced=False)``), against the product's equal batches.

The variants are emulations in memory only (no daemon serves them). Run as ``python bench/link_variants.py
VARIANT TRAINER-ARGS...``: the trainer's ``--mode inmemory --task link --link-order comet`` run, with the
variant's batches.
"""

import sys
from collections.abc import Sequence

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from loader.sampling.buffer_order import BufferState
from loader.sampling.induced import induced_by_ranges, local_in_ranges
from loader.sampling.link_sampling import SampledLinkBatch
from loader.sampling.negative_weights import buffer_negative_weights
from loader.sampling.sampling import CSCGraph
from trainer.link import inmemory
from trainer.link.batches import LinkBatch

__all__ = ["VARIANTS", "WIDEN", "GlobalNeighbours", "UniformNegatives", "Widened", "HybridNegatives",
           "SourceWeightedNegatives", "TailBatches", "main"]

WIDEN = 0.5
"""``comet-widened``: nodes added to each state's buffer, as a share of the buffer's nodes."""


class GlobalNeighbours(inmemory.LinkInMemorySource):
    """COMET's states and negatives; neighbours from the whole graph."""

    uniform_negatives = False

    def _state_view(self, epoch: int, state: BufferState
                    ) -> tuple[CSCGraph, np.ndarray, np.ndarray, np.ndarray | None]:
        pool = None if self.uniform_negatives else state.resident_nodes()
        return self.data.graph, self.train_edges[0, state.order], self.train_edges[1, state.order], pool


class UniformNegatives(GlobalNeighbours):
    """COMET's states (its edge order) only: neighbours from the whole graph, negatives uniform over every node."""

    uniform_negatives = True


class Widened(inmemory.LinkInMemorySource):
    """Each state's buffer plus ``WIDEN`` x its nodes drawn uniformly from outside it: neighbours in the subgraph
    the union induces, negatives from all of it."""

    def _state_view(self, epoch: int, state: BufferState
                    ) -> tuple[CSCGraph, np.ndarray, np.ndarray, np.ndarray | None]:
        resident = np.zeros(self.num_nodes, dtype=bool)
        resident[state.resident_nodes()] = True
        outside = np.flatnonzero(~resident)
        rng = np.random.default_rng([self.seed, epoch, state.index])
        extra = np.sort(rng.choice(outside, size=min(len(outside), round(WIDEN * resident.sum())), replace=False))
        begin = np.concatenate((state.node_begin, extra))
        cut = np.argsort(begin, kind="stable")
        begin, end = begin[cut], np.concatenate((state.node_end, extra + 1))[cut]
        graph = induced_by_ranges(self.data.graph, begin, end)
        return (graph, local_in_ranges(self.train_edges[0, state.order], begin, end),
                local_in_ranges(self.train_edges[1, state.order], begin, end),
                np.arange(graph.num_nodes, dtype=np.int64))


class HybridNegatives(inmemory.LinkInMemorySource):
    """COMET's states and resident neighbourhoods; negatives uniform over every node, and a node outside the buffer
    with its whole in-list (the graph over every node with each resident node's in-list cut to resident sources)."""

    def _state_view(self, epoch: int, state: BufferState
                    ) -> tuple[CSCGraph, np.ndarray, np.ndarray, np.ndarray | None]:
        full = self.data.graph
        resident = np.zeros(self.num_nodes, dtype=bool)
        resident[state.resident_nodes()] = True
        target = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(full.indptr))
        keep = ~resident[target] | resident[full.indices]
        indptr = np.zeros(self.num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(target[keep], minlength=self.num_nodes), out=indptr[1:])
        graph = CSCGraph(indptr=indptr, indices=full.indices[keep], global_ids=full.global_ids)
        return graph, self.train_edges[0, state.order], self.train_edges[1, state.order], None


class SourceWeightedNegatives(inmemory.LinkInMemorySource):
    """COMET's batches, each negative weighted by whether it shares the source's partition alone."""

    def _state_view(self, epoch: int, state: BufferState
                    ) -> tuple[CSCGraph, np.ndarray, np.ndarray, np.ndarray | None]:
        view = super()._state_view(epoch, state)
        self._resident = int(view[0].num_nodes)
        return view

    def _link_batch(self, sampled: SampledLinkBatch, positives: int, stream_batches: int,
                    global_positives: int | None = None, weight: np.ndarray | None = None) -> LinkBatch:
        parts = self.partitions.partition_of(sampled.edge_label_global)
        # the source's partition as the pair's only near one: each negative's target taken as its source
        alone = np.stack([parts[0], np.concatenate([parts[0, :positives], parts[1, positives:]])])
        sizes = self.partitions.num_nodes
        weight = buffer_negative_weights(alone, positives, sizes, int(sizes.sum()), self._resident)
        return super()._link_batch(sampled, positives, stream_batches, global_positives, weight)


class TailBatches(inmemory.LinkInMemorySource):
    """COMET with each state cut into full batches and a short last one."""

    balanced_batches = False


VARIANTS: dict[str, type[inmemory.LinkInMemorySource]] = {
    "comet-global-neighbours": GlobalNeighbours, "comet-uniform-negatives": UniformNegatives,
    "comet-widened": Widened, "comet-hybrid-negatives": HybridNegatives,
    "comet-source-weighted-negatives": SourceWeightedNegatives, "comet-tail-batches": TailBatches}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in VARIANTS:
        print(f"usage: link_variants.py {{{','.join(VARIANTS)}}} TRAINER-ARGS...", file=sys.stderr)
        return 2
    from trainer.cli import main as trainer_main

    # the trainer builds its in-memory link source from this module attribute when it runs
    original = inmemory.LinkInMemorySource
    inmemory.LinkInMemorySource = VARIANTS[args[0]]  # type: ignore[misc]
    try:
        return trainer_main(args[1:])
    finally:  # called in a process that goes on (a test): the trainer's own source again
        inmemory.LinkInMemorySource = original  # type: ignore[misc]


if __name__ == "__main__":
    sys.exit(main())
