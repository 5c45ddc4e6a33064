"""Link prediction in the daemon (issue 31): a link dataset's splits, held in RAM, and how its batches are made.

A dataset imported with ``--task link`` is served as link prediction, never as node classification (its
node labels are not what it is trained for). Training batches are ``loader.sampling.link_sampling``'s:
epoch e's plan over the training positives (``link_batch_plan``), each batch's negatives, seeds and
neighbour sample exactly as the in-memory reference draws them, the neighbours sampled by the mode's own
sampler (its neighbour cache and checked reads: ``FullGraphMode.sample``, which gives ``sample_pass``'s
batch for the same seeds and key), so a full-graph mode's link batches are the reference's, bitwise.

Evaluation embeds the nodes a split's scores need (``HeldOut.nodes``) in node batches of
``eval_batch_size`` with the keys of ``eval_split_batches`` on the split's link stream, as the in-memory
trainer does, and each batch carries its share of the split's positives and their fixed negative tails
(``HeldOutShares``), as positions into those nodes: the trainer scores them once the stream has ended.

What is not served yet: the hierarchical mode (a mega-batch would need MariusGNN's edge buckets and a
buffer order, issue 31's COMET mode), mode staged (its memory plan charges spilled superbatches, which
link batches are not), the aggregation cache and training jobs of several ranks. Each is refused in one
line (``link_problem``, the handshake).
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from loader.daemon.config import LoaderConfig
from loader.format.dataset import Dataset
from loader.sampling.link_sampling import (
    HeldOut,
    LinkEpochPlan,
    PassLinkLabels,
    SampledLinkBatch,
    held_out_pairs,
    link_pass,
    sample_link_batch_by,
)
from loader.sampling.sampling import SampledBatch, SampledPass
from proto.errors import UserError

__all__ = ["LinkServing", "load_link_serving", "link_problem", "sample_link_steps", "LINK_MODES"]

LINK_MODES = ("exact", "static", "hybrid", "mmap", "inmemory")
"""``[loader] mode`` values that serve a link dataset (the full-graph modes whose batches are the reference's)."""

PassSampler = Callable[[np.ndarray, int, tuple[int, ...], np.ndarray], SampledPass]
"""A mode's ``sample(seeds, batch_size, fanouts, keys)``."""


@dataclass(frozen=True)
class LinkServing:
    """A link dataset's positives, read once at startup (int64 dataset ids), and ``[link]``'s settings."""

    train_edges: np.ndarray
    """(2, P) training positives, source row 0."""
    held_out: dict[str, HeldOut]
    """"val", "test" -> the split's positives and fixed negative tails as positions into its nodes."""
    eval_negatives: int
    negatives: int
    disjoint: bool

    @property
    def train_positives(self) -> int:
        return int(self.train_edges.shape[1])

    @property
    def nbytes(self) -> int:
        held = sum(h.nodes.nbytes + h.src.nbytes + h.dst.nbytes + h.tails.nbytes for h in self.held_out.values())
        return int(self.train_edges.nbytes) + held


def link_problem(dataset: Dataset, config: LoaderConfig) -> str | None:
    """Why ``config`` cannot serve ``dataset``'s link task (one line), or None (also for a node dataset)."""
    if dataset.manifest.link is None:
        return None
    mode = config.loader.mode
    if mode not in LINK_MODES:
        return (f"[loader] mode {mode}: {dataset.path.name} is a link-prediction dataset, which modes "
                f"{', '.join(LINK_MODES)} serve so far")
    if config.sampler.aggregation_cache:
        return "[sampler] aggregation_cache: not with a link-prediction dataset (the link models read no x_agg)"
    return None


def load_link_serving(dataset: Dataset, config: LoaderConfig) -> LinkServing | None:
    """A link dataset's splits (None for a node dataset); UserError for a file that does not fit the manifest."""
    link = dataset.manifest.link
    if link is None:
        return None
    num_nodes = dataset.manifest.num_nodes

    def read(name: str, shape: tuple[int, int]) -> np.ndarray:
        array = dataset.read(name, np.int64, 2)
        if array.shape != shape:
            raise UserError(f"{dataset.file(name)}: shape {array.shape}, the manifest's link table says {shape}")
        if array.size and (array.min() < 0 or array.max() >= num_nodes):
            raise UserError(f"{dataset.file(name)}: node ids outside [0, {num_nodes})")
        return array

    held = {split: held_out_pairs(read(f"{split}_edges", (2, link.of(split))),
                                  read(f"{split}_neg_tails", (link.of(split), link.eval_negatives)))
            for split in ("val", "test")}
    return LinkServing(read("train_edges", (2, link.train)), held, link.eval_negatives, config.link.negatives,
                       config.link.disjoint)


def sample_link_steps(sample: PassSampler, link: LinkServing, plan: LinkEpochPlan, first: int, last: int,
                      num_nodes: int, fanouts: tuple[int, ...]) -> tuple[SampledPass, PassLinkLabels]:
    """Batches ``first:last`` of ``plan`` sampled through ``sample`` (a full-graph mode's: dataset ids are local
    ids), as one pass and its pairs: batch by batch, since each has its own seeds (a loop over batches, not
    nodes)."""
    hops = len(fanouts)

    def seeds_sampled(seeds: np.ndarray, key: int) -> SampledBatch:
        return sample(seeds, len(seeds), fanouts, np.array([key], dtype=np.uint64)).batch(0)

    batches: list[SampledLinkBatch] = []
    for b in range(first, last):
        positions, key = plan.batch(b)
        batches.append(sample_link_batch_by(seeds_sampled, num_nodes, None, link.train_edges[0, positions],
                                            link.train_edges[1, positions], num_nodes, hops, key,
                                            negatives_per_positive=link.negatives, disjoint=link.disjoint))
    return link_pass(batches, hops)
