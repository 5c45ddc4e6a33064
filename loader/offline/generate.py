"""Synthetic graphs for ``megabatch generate``: power-law degrees, communities, homophilous labels.

The model is a degree-corrected stochastic block model sampled Chung-Lu style:

- every node gets a weight from a Pareto distribution (degree exponent ``DEGREE_EXPONENT``),
  capped at an expected degree of ``sqrt(N * avg_degree / communities)`` so that even two
  hubs of one community are expected to be joined less than once;
- nodes are assigned to ``COMMUNITIES_PER_CLASS * num_classes`` communities uniformly at
  random (node ids are not sorted by community); ``label = community % num_classes``;
- each undirected edge picks its first endpoint anywhere with probability proportional to
  weight, and its second endpoint, with probability ``INTRA_FRACTION``, inside the first
  endpoint's community (again proportional to weight), otherwise anywhere;
- features are the node's class mean plus unit Gaussian noise; class means point in random
  directions with norm about ``CLASS_SEPARATION``, small next to the noise (norm about
  ``sqrt(feat_dim)``), so a classifier on one node's features is unreliable. About 80% of a
  node's neighbours share its class, and averaging them shrinks the noise by the square
  root of the degree while keeping most of the class signal: neighbour aggregation
  (GraphSAGE) clearly beats an MLP, which cannot do better than the nearest class mean.

Streaming: only per-node arrays (community, the community-ordered node list and its
cumulative weights, labels; about 24 bytes per node, more while they are built and the
split is drawn) and the (num_classes, feat_dim) class means are held whole. Edges and features are
generated in chunks sized from ``memory_budget`` and appended to the output files. Random
numbers come from fixed-size blocks each seeded by ``(stream, block, seed)``, and a chunk is a
run of whole blocks, so the output depends only on the arguments, not on the memory budget.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loader.format.npyio import rows_per_chunk
from loader.format.raw import FEATURE_DTYPES, RawDataset, RawDatasetWriter
from loader.format.splits import stratified_split
from proto.errors import UserError
from proto.progress import Progress

__all__ = ["CLASS_SEPARATION", "COMMUNITIES_PER_CLASS", "DEGREE_EXPONENT", "GENERATOR", "INTRA_FRACTION",
           "generate_graph"]

GENERATOR = "megabatch.generate"
COMMUNITIES_PER_CLASS = 4
INTRA_FRACTION = 0.8
"""Probability that an edge's second endpoint is drawn inside the first endpoint's community."""
DEGREE_EXPONENT = 2.5
"""Tail exponent of the degree distribution, as in many web and social graphs."""
CLASS_SEPARATION = 1.6
"""Expected norm of a class mean, in units of the per-feature noise standard deviation."""

# Block sizes fix how random numbers map to output; changing them changes every dataset.
_EDGE_BLOCK = 1 << 16
_FEATURE_BLOCK_VALUES = 1 << 18
# Peak working set per undirected edge in a chunk: three uniforms, the sort and search
# temporaries, community ids and both endpoint arrays.
_EDGE_CHUNK_BYTES = 160
_NODE_STREAM, _EDGE_STREAM, _FEATURE_STREAM = 0, 1, 2
_SELF_LOOP_RETRIES = 8


def _rng(stream: int, index: int, seed: int) -> np.random.Generator:
    # The seed goes last: SeedSequence splits big ints into 32-bit words and ignores
    # trailing zero words, so any other order lets two different seeds collide.
    return np.random.default_rng([stream, index, seed])


@dataclass(frozen=True)
class _Sampler:
    """Weighted node sampling by inverse CDF over nodes listed community by community.

    Range ``c < K`` is community ``c``; range ``K`` is the whole graph.
    """

    members: np.ndarray  # node ids ordered by community
    cumweight: np.ndarray  # inclusive cumulative weight along ``members``
    low: np.ndarray  # (K+1,) cumulative weight before each range
    span: np.ndarray  # (K+1,) total weight of each range
    start: np.ndarray  # (K+1,) first position of each range
    stop: np.ndarray  # (K+1,) one past the last position

    def draw(self, ranges: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """Node ids, one per edge, drawn by weight within ``ranges`` using ``uniform`` in [0, 1)."""
        target = self.low[ranges] + uniform * self.span[ranges]
        # Binary searches with sorted targets touch neighbouring cache lines: ~8x faster.
        order = np.argsort(target)
        pos = np.empty(len(target), dtype=np.int64)
        pos[order] = np.searchsorted(self.cumweight, target[order], side="right")
        del target, order
        # Rounding can land a target exactly on a range's upper end.
        np.clip(pos, self.start[ranges], self.stop[ranges] - 1, out=pos)
        return self.members[pos].astype(np.int64)


def _node_model(num_nodes: int, avg_degree: float, communities: int, seed: int
                ) -> tuple[np.ndarray, _Sampler]:
    small = np.int32 if max(num_nodes, communities) < 2**31 else np.int64
    rng = _rng(_NODE_STREAM, 0, seed)
    community = rng.integers(communities, size=num_nodes, dtype=small)
    tail = DEGREE_EXPONENT - 1
    weight = rng.pareto(tail, num_nodes) + 1.0
    # Mean weight tail/(tail-1) corresponds to avg_degree. Capping expected degrees at
    # sqrt(N * d / K) keeps the expected number of edges between two hubs of one community
    # below one, so duplicate pairs stay rare (~0.6% at 1M nodes, degree 20, 10 classes;
    # the cap sqrt(N * d) that ignores communities gives ~1.6%).
    np.minimum(weight, tail / (tail - 1) * math.sqrt(num_nodes / avg_degree / communities), out=weight)
    members = np.argsort(community, kind="stable").astype(small)
    cumweight = np.cumsum(weight[members])
    del weight
    counts = np.bincount(community, minlength=communities)
    stop = np.append(np.cumsum(counts), num_nodes).astype(np.int64)
    start = np.append(stop[:-1] - counts, 0)
    before = np.where(start > 0, cumweight[np.maximum(start - 1, 0)], 0.0)
    after = np.where(stop > 0, cumweight[np.maximum(stop - 1, 0)], 0.0)
    return community, _Sampler(members, cumweight, before, after - before, start, stop)


def _fix_self_loops(sampler: _Sampler, rngs: list[np.random.Generator], src: np.ndarray, dst: np.ndarray,
                    ranges: np.ndarray, num_nodes: int) -> None:
    """Redraw ``dst`` where it equals ``src``, using each edge's own block generator."""
    for attempt in range(_SELF_LOOP_RETRIES + 1):
        loops = np.flatnonzero(src == dst)
        if not loops.size:
            return
        blocks, counts = np.unique(loops // _EDGE_BLOCK, return_counts=True)
        uniform = np.concatenate([rngs[b].random(c) for b, c in zip(blocks.tolist(), counts.tolist())])
        if attempt < _SELF_LOOP_RETRIES:
            dst[loops] = sampler.draw(ranges[loops], uniform)
        else:
            # A one-node community (or one hub holding nearly all of it): take any other node.
            dst[loops] = (src[loops] + 1 + (uniform * (num_nodes - 1)).astype(np.int64)) % num_nodes


def _write_edges(writer: RawDatasetWriter, sampler: _Sampler, community: np.ndarray, num_edges: int,
                 seed: int, memory_budget: int, progress: bool) -> None:
    num_nodes = len(community)
    global_range = len(sampler.start) - 1
    nblocks = -(-num_edges // _EDGE_BLOCK)
    per_chunk = rows_per_chunk(_EDGE_CHUNK_BYTES * _EDGE_BLOCK, memory_budget)
    with Progress("generate edges", 2 * num_edges, "edges", enabled=progress) as bar:
        for first in range(0, nblocks, per_chunk):
            last = min(nblocks, first + per_chunk)
            count = min(num_edges, last * _EDGE_BLOCK) - first * _EDGE_BLOCK
            rngs = [_rng(_EDGE_STREAM, b, seed) for b in range(first, last)]
            uniform = np.empty((3, count))
            for j, rng in enumerate(rngs):
                lo, hi = j * _EDGE_BLOCK, min(count, (j + 1) * _EDGE_BLOCK)
                uniform[:, lo:hi] = rng.random((3, hi - lo))
            src = sampler.draw(np.full(count, global_range), uniform[0])
            ranges = np.where(uniform[1] < INTRA_FRACTION, community[src], global_range)
            dst = sampler.draw(ranges, uniform[2])
            del uniform
            _fix_self_loops(sampler, rngs, src, dst, ranges, num_nodes)
            # Both directions block by block, so the file order is the same for any chunk size.
            for lo in range(0, count, _EDGE_BLOCK):
                hi = min(count, lo + _EDGE_BLOCK)
                writer.append_edges(src[lo:hi], dst[lo:hi])
                writer.append_edges(dst[lo:hi], src[lo:hi])
            bar.update(2 * count)


def _write_features(writer: RawDatasetWriter, labels: np.ndarray, feat_dim: int, num_classes: int,
                    seed: int, memory_budget: int, progress: bool) -> None:
    num_nodes = len(labels)
    # Spreading the separation over all dimensions keeps difficulty independent of feat_dim.
    means = _rng(_NODE_STREAM, 1, seed).standard_normal((num_classes, feat_dim), dtype=np.float32)
    means *= np.float32(CLASS_SEPARATION / math.sqrt(feat_dim))
    block_rows = max(1, _FEATURE_BLOCK_VALUES // feat_dim)
    nblocks = -(-num_nodes // block_rows)
    # noise (float32), gathered means (float32), the float16 cast
    per_chunk = rows_per_chunk((10 * feat_dim + 8) * block_rows, memory_budget)
    with Progress("generate features", num_nodes, "rows", enabled=progress) as bar:
        for first in range(0, nblocks, per_chunk):
            last = min(nblocks, first + per_chunk)
            row0, row1 = first * block_rows, min(num_nodes, last * block_rows)
            rows = np.empty((row1 - row0, feat_dim), dtype=np.float32)
            for b in range(first, last):
                lo, hi = b * block_rows - row0, min(row1, (b + 1) * block_rows) - row0
                _rng(_FEATURE_STREAM, b, seed).standard_normal(out=rows[lo:hi], dtype=np.float32)
            rows += means[labels[row0:row1]]
            writer.append_features(rows)
            bar.update(row1 - row0)


def _validate(num_nodes: int, avg_degree: float, feat_dim: int, num_classes: int, seed: int,
              feat_dtype: str, split: tuple[float, float, float], memory_budget: int) -> None:
    def is_int(value: object) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

    if not is_int(num_nodes) or num_nodes < 2:
        raise UserError(f"--nodes must be an integer >= 2, got {num_nodes!r}")
    if not isinstance(avg_degree, (int, float)) or not 0 < avg_degree < num_nodes:
        raise UserError(f"--avg-degree must be > 0 and < --nodes ({num_nodes}), got {avg_degree!r}")
    if not is_int(feat_dim) or feat_dim < 1:
        raise UserError(f"--feat-dim must be an integer >= 1, got {feat_dim!r}")
    if not is_int(num_classes) or not 2 <= num_classes <= num_nodes:
        raise UserError(f"--classes must be an integer >= 2 and <= --nodes ({num_nodes}), got {num_classes!r}")
    if not is_int(seed) or seed < 0:
        raise UserError(f"--seed must be a non-negative integer, got {seed!r}")
    if feat_dtype not in FEATURE_DTYPES:
        raise UserError(f"--feat-dtype must be one of {', '.join(FEATURE_DTYPES)}, got {feat_dtype!r}")
    if (len(split) != 3 or not all(isinstance(r, (int, float)) and r >= 0 for r in split)
            or sum(split) > 1 + 1e-9):
        raise UserError(f"--split must be three non-negative ratios summing to at most 1, got {split!r}")
    if not is_int(memory_budget) or memory_budget < 1:
        raise UserError(f"--memory-budget must be a positive byte count, got {memory_budget!r}")


def generate_graph(out: Path, *, num_nodes: int, avg_degree: float, feat_dim: int, num_classes: int,
                   seed: int = 0, feat_dtype: str = "float32", split: tuple[float, float, float] = (0.6, 0.2, 0.2),
                   memory_budget: int = 1 << 30, progress: bool = True) -> RawDataset:
    """Write a synthetic undirected graph to the new raw dataset directory ``out``.

    ``num_nodes`` (>= 2) nodes; ``round(num_nodes * avg_degree / 2)`` undirected edges, each
    stored in both directions, so ``num_edges`` is twice that and the mean degree is
    ``avg_degree``. No self-loops. Edges are sampled independently and not deduplicated, so
    a pair can repeat: about 0.6% of edges at 1M nodes and degree 20, a few percent on
    graphs of a few thousand nodes, whose communities are small and dense. ``feat_dim``
    features of ``feat_dtype`` (float32, the default, or float16);
    labels in ``[0, num_classes)``; a stratified split with ratios ``split`` (default
    0.6/0.2/0.2) seeded by ``seed`` (default 0). ``memory_budget`` (default 1 GiB) bounds the
    edge and feature chunks; per-node arrays add about 24 bytes per node on top. It does not
    affect the output: equal arguments give byte-identical files for any budget.
    ``progress`` (default on) reports edge and feature generation. Raises UserError for bad
    arguments or an existing ``out``.
    """
    _validate(num_nodes, avg_degree, feat_dim, num_classes, seed, feat_dtype, split, memory_budget)
    num_nodes, feat_dim, num_classes, seed = int(num_nodes), int(feat_dim), int(num_classes), int(seed)
    split = (float(split[0]), float(split[1]), float(split[2]))
    communities = COMMUNITIES_PER_CLASS * num_classes
    num_edges = round(num_nodes * float(avg_degree) / 2)
    source = {"generator": GENERATOR, "num_nodes": num_nodes, "avg_degree": float(avg_degree),
              "feat_dim": feat_dim, "num_classes": num_classes, "seed": seed, "feat_dtype": feat_dtype,
              "split": list(split), "communities": communities, "intra_fraction": INTRA_FRACTION,
              "degree_exponent": DEGREE_EXPONENT, "class_separation": CLASS_SEPARATION}
    writer = RawDatasetWriter(out, num_nodes=num_nodes, feat_dim=feat_dim, num_classes=num_classes,
                              feat_dtype=feat_dtype, source=source)
    try:
        community, sampler = _node_model(num_nodes, float(avg_degree), communities, seed)
        _write_edges(writer, sampler, community, num_edges, seed, memory_budget, progress)
        del sampler
        labels = (community % num_classes).astype(np.int64)
        del community
        _write_features(writer, labels, feat_dim, num_classes, seed, memory_budget, progress)
        writer.write_labels(labels)
        writer.write_split(*stratified_split(labels, split, seed))
    except BaseException as err:
        writer.abort(err)
        raise
    return writer.close()
