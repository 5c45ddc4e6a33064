"""Multi-hop neighbour sampling of every mini-batch of a pass in one kernel call (the superbatch sampler).

The output is PyG-native: per batch a node list, a ``[2, E]`` edge index of batch-local
positions (row 0 the sampled neighbour, row 1 the target) and the per-hop counts that
``torch_geometric.utils.trim_to_layer`` reads.

Semantics, per batch (``seeds[b * batch_size:(b + 1) * batch_size]``, the last one may be short):

* ``nodes`` starts as the batch's seeds, which must be distinct.
* Hop h = 1..L expands the frontier: the nodes first added at hop h-1 (the seeds for h = 1);
  as in PyG, a node reached again is never expanded again. Targets are taken in node order.
* A target v with in-neighbour list ``indices[indptr[v]:indptr[v+1]]`` of length d takes all
  d entries, in list order, when ``fanouts[h-1] == -1`` or d <= fanout; otherwise it takes
  ``fanout`` distinct list positions chosen by Robert Floyd's algorithm, in the order that
  algorithm picks them. ``fanout == 0`` takes nothing.
* Each taken neighbour u already in the batch (a seed, an earlier hop, or earlier in this
  hop) keeps its position; otherwise it is appended (first-seen order). The edge
  (position of u, position of v) is emitted for every taken entry, so a duplicate edge in
  the list that is taken twice is emitted twice. Edges are ordered hop by hop, then by
  target, then by pick.

RNG (counter-based: a draw depends only on the batch key, the hop, the target's global id
and the draw index, never on threads, call order or local ids; all arithmetic mod 2^64)::

    mix64(z)   = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^ (z >> 31)
    GAMMA      = 0x9E3779B97F4A7C15
    hop_key    = mix64(batch_key + h * GAMMA)                      (h = 1..L)
    target_key = mix64(hop_key ^ mix64(global_ids[v]))             (global id as two's-complement uint64)
    draw_j     = mix64(target_key + (j + 1) * GAMMA)               (j = 0..fanout-1)
    Floyd step j: top = d - fanout + j; t = draw_j mod (top + 1); pick t, or top if t was picked already.

So the same target with the same neighbour list picks the same neighbours in any graph or
ordering that keeps its global id. ``batch_keys`` derives the batch keys:
``base = mix64(seed)``, then ``base = mix64(base ^ mix64(x + GAMMA))`` for x in
(stream, epoch, pass_index), and ``key_i = mix64(base + (first_batch + i + 1) * GAMMA)``.

Cost: one ``sample_pass`` call allocates a mark array of M int32 (int64 past 2^31 nodes),
resets only the entries each batch used, and grows its output buffers geometrically from the
fanout bound, so time and memory follow the output, not B * prod(fanouts) nor B * M.
"""

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from loader.sampling.sampling_kernels import STATUS_BAD_NEIGHBOUR, STATUS_DUPLICATE_SEED, sample_pass_kernel

__all__ = ["CSCGraph", "SampledBatch", "SampledBatches", "SampledPass", "batch_keys", "shuffle", "sample_pass",
           "check_pass_args", "as_int", "as_int_array", "empty_pass", "concat_passes", "slice_pass", "mix64_array",
           "position_keys", "key_shares"]

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_INITIAL_CAPACITY_CAP = 1 << 24
"""Largest first guess (items) for an output buffer; beyond it the kernel grows the buffer."""


def as_int_array(field: str, value: object, wanted: tuple[type[np.integer], ...]) -> np.ndarray:
    """``value`` as a C-contiguous 1-D array of the first of ``wanted`` it converts to losslessly.

    An array already of a wanted dtype and contiguous is returned as is (a memmap stays a
    memmap, uncopied).
    """
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.ndim != 1:
        raise ValueError(f"{field}: expected a 1-D array, got shape {array.shape}")
    if array.size == 0 and array.dtype.kind not in "iu":
        array = array.astype(wanted[0])
    if array.dtype.kind not in "iu":
        raise ValueError(f"{field}: expected an integer array, got dtype {array.dtype}")
    if not any(array.dtype == np.dtype(dtype) for dtype in wanted):
        target = next((dtype for dtype in wanted if np.can_cast(array.dtype, dtype, "safe")), None)
        if target is None:
            names = " or ".join(np.dtype(dtype).name for dtype in wanted)
            raise ValueError(f"{field}: dtype {array.dtype} does not convert losslessly to {names}")
        array = array.astype(target)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def as_int(field: str, value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{field}: expected an integer, got {value!r}") from None


@dataclass(frozen=True)
class CSCGraph:
    """In-neighbour lists: ``indices[indptr[v]:indptr[v+1]]`` are the sources u of edges u->v (local ids).

    indptr: int64 [M+1], starts at 0 and ends at len(indices); indices: int32 or int64 [E],
    values in [0, M); global_ids: int64 [M], the dataset-wide id of each local node, which
    keys the RNG. Other integer dtypes are converted where lossless. Arrays already in shape
    are kept as they are (a memory-mapped graph is not copied); values are not scanned, so
    an out-of-range neighbour is reported by ``sample_pass`` only when it is reached.
    """

    indptr: np.ndarray
    indices: np.ndarray
    global_ids: np.ndarray

    def __post_init__(self) -> None:
        indptr = as_int_array("indptr", self.indptr, (np.int64,))
        indices = as_int_array("indices", self.indices, (np.int32, np.int64))
        global_ids = as_int_array("global_ids", self.global_ids, (np.int64,))
        if len(indptr) == 0:
            raise ValueError("indptr: length 0, expected M+1 >= 1 entries")
        if indptr[0] != 0:
            raise ValueError(f"indptr: first entry is {indptr[0]}, expected 0")
        if indptr[-1] != len(indices):
            raise ValueError(f"indptr: last entry is {indptr[-1]}, expected len(indices) = {len(indices)}")
        if len(global_ids) != len(indptr) - 1:
            raise ValueError(f"global_ids: length {len(global_ids)}, expected M = len(indptr) - 1 = {len(indptr) - 1}")
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "global_ids", global_ids)

    @property
    def num_nodes(self) -> int:
        return len(self.global_ids)

    @property
    def num_edges(self) -> int:
        return len(self.indices)


@dataclass(frozen=True)
class SampledBatch:
    """One sampled mini-batch (views into a ``SampledPass``, except ``edge_index``).

    nodes: int64 [n], local ids, seeds first, then the nodes first reached at hop 1, hop 2, ...;
    edge_index: int64 [2, E], positions into ``nodes``, row 0 the source (sampled neighbour),
    row 1 the target, hop-1 edges first; num_sampled_nodes: int64 [L+1], entry 0 the number of
    seeds; num_sampled_edges: int64 [L].
    """

    nodes: np.ndarray
    edge_index: np.ndarray
    num_sampled_nodes: np.ndarray
    num_sampled_edges: np.ndarray


class SampledBatches(Protocol):
    """A pass of sampled batches as the daemon's stages read it: the full-graph planners (``rows_for``), the
    publisher and a client's feature cache. Two types have it: ``SampledPass`` (the whole pass in RAM) and
    the staged mode's ``SpilledPass`` (``loader.staging.spilled_pass``: per-batch tables in RAM, ids and edges
    read back from a spill file), so a consumer typed against this works with either and reads nothing else.
    """

    @property
    def num_batches(self) -> int: ...

    @property
    def num_hops(self) -> int: ...

    @property
    def node_ptr(self) -> np.ndarray:
        """int64 [B + 1]: batch b is nodes ``node_ptr[b]:node_ptr[b + 1]`` of the pass."""
        ...

    @property
    def num_sampled_nodes(self) -> np.ndarray:
        """int64 [B, L + 1]: batch b's nodes per hop (column 0: its seeds), in RAM (the publisher counts seeds)."""
        ...

    @property
    def nodes(self) -> np.ndarray:
        """Every batch's ids, concatenated (a spilled pass reads all of them back: ``node_ids`` reads a slice)."""
        ...

    def node_ids(self, begin: int, end: int) -> np.ndarray:
        """Nodes ``begin:end`` of the pass, across batches (int32 or int64); ``IndexError`` outside the pass."""
        ...

    def batch(self, b: int) -> SampledBatch:
        """Batch ``b`` (0 <= b < num_batches), ids as int64; ``IndexError`` outside the pass."""
        ...


@dataclass(frozen=True)
class SampledPass:
    """Every batch of one pass, concatenated: batch b owns ``nodes[node_ptr[b]:node_ptr[b+1]]``
    and edges ``edge_ptr[b]:edge_ptr[b+1]``.

    edge_src/edge_dst (int64) are batch-local positions; num_sampled_nodes is int64 [B, L+1],
    num_sampled_edges int64 [B, L]. The constructor checks the shapes agree (O(1)).
    """

    num_batches: int
    num_hops: int
    node_ptr: np.ndarray
    nodes: np.ndarray
    edge_ptr: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    num_sampled_nodes: np.ndarray
    num_sampled_edges: np.ndarray

    def __post_init__(self) -> None:
        b, hops = self.num_batches, self.num_hops
        expected = {"node_ptr": (b + 1,), "edge_ptr": (b + 1,), "num_sampled_nodes": (b, hops + 1),
                    "num_sampled_edges": (b, hops), "nodes": (int(self.node_ptr[-1]),),
                    "edge_src": (int(self.edge_ptr[-1]),), "edge_dst": (int(self.edge_ptr[-1]),)}
        for name, shape in expected.items():
            array = getattr(self, name)
            if array.dtype != np.int64 or array.shape != shape:
                raise ValueError(f"{name}: {array.dtype} {array.shape}, expected int64 {shape}")

    def batch(self, b: int) -> SampledBatch:
        """Batch ``b`` (0 <= b < num_batches); ``edge_index`` is a fresh [2, E] copy."""
        if not 0 <= b < self.num_batches:
            raise IndexError(f"batch {b} outside [0, {self.num_batches})")
        edges = slice(int(self.edge_ptr[b]), int(self.edge_ptr[b + 1]))
        return SampledBatch(nodes=self.nodes[self.node_ptr[b]:self.node_ptr[b + 1]],
                            edge_index=np.stack((self.edge_src[edges], self.edge_dst[edges])),
                            num_sampled_nodes=self.num_sampled_nodes[b],
                            num_sampled_edges=self.num_sampled_edges[b])

    def node_ids(self, begin: int, end: int) -> np.ndarray:
        """Nodes ``begin:end`` of the pass (a view of ``nodes``), checked as ``SpilledPass.node_ids`` checks them."""
        if not 0 <= begin <= end <= len(self.nodes):
            raise IndexError(f"nodes {begin}:{end} outside the pass's {len(self.nodes)}")
        return self.nodes[begin:end]

    def max_batch_nodes(self) -> int:
        """Most nodes in any batch (0 for an empty pass): sizes a shared-memory slot."""
        return int(np.diff(self.node_ptr).max()) if self.num_batches else 0

    def max_batch_edges(self) -> int:
        """Most edges in any batch (0 for an empty pass)."""
        return int(np.diff(self.edge_ptr).max()) if self.num_batches else 0


if TYPE_CHECKING:  # mypy checks here, not only where a consumer takes one, that a SampledPass is SampledBatches
    _in_ram: type[SampledBatches] = SampledPass


def empty_pass(num_batches: int, num_hops: int) -> SampledPass:
    """``num_batches`` batches without a seed (a rank's empty piece of a short last global batch)."""
    zeros = np.zeros(num_batches + 1, dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    return SampledPass(num_batches=num_batches, num_hops=num_hops, node_ptr=zeros, nodes=none, edge_ptr=zeros.copy(),
                       edge_src=none, edge_dst=none.copy(),
                       num_sampled_nodes=np.zeros((num_batches, num_hops + 1), dtype=np.int64),
                       num_sampled_edges=np.zeros((num_batches, num_hops), dtype=np.int64))


def slice_pass(sampled: SampledPass, first: int, count: int) -> SampledPass:
    """Batches ``first`` .. ``first + count`` of ``sampled`` as a pass of their own (views, pointers rebased)."""
    if first < 0 or count < 0 or first + count > sampled.num_batches:
        raise ValueError(f"batches {first} + {count} outside the pass's {sampled.num_batches}")
    lo, hi = sampled.node_ptr[first], sampled.node_ptr[first + count]
    e_lo, e_hi = sampled.edge_ptr[first], sampled.edge_ptr[first + count]
    return SampledPass(count, sampled.num_hops, sampled.node_ptr[first:first + count + 1] - lo, sampled.nodes[lo:hi],
                       sampled.edge_ptr[first:first + count + 1] - e_lo, sampled.edge_src[e_lo:e_hi],
                       sampled.edge_dst[e_lo:e_hi], sampled.num_sampled_nodes[first:first + count],
                       sampled.num_sampled_edges[first:first + count])


def concat_passes(passes: Sequence[SampledPass]) -> SampledPass:
    """The batches of ``passes`` (at least one, all with the same hop count) as one pass, in order."""
    if not passes:
        raise ValueError("concat_passes: no pass")
    if len(passes) == 1:
        return passes[0]
    hops = passes[0].num_hops
    if any(p.num_hops != hops for p in passes):
        raise ValueError(f"concat_passes: hop counts {[p.num_hops for p in passes]} differ")

    def pointers(name: str) -> np.ndarray:
        arrays = [getattr(p, name) for p in passes]
        shifts = np.cumsum([0] + [int(a[-1]) for a in arrays[:-1]])
        return np.concatenate([arrays[0][:1]] + [a[1:] + shift for a, shift in zip(arrays, shifts, strict=True)])

    return SampledPass(num_batches=sum(p.num_batches for p in passes), num_hops=hops, node_ptr=pointers("node_ptr"),
                       nodes=np.concatenate([p.nodes for p in passes]), edge_ptr=pointers("edge_ptr"),
                       edge_src=np.concatenate([p.edge_src for p in passes]),
                       edge_dst=np.concatenate([p.edge_dst for p in passes]),
                       num_sampled_nodes=np.concatenate([p.num_sampled_nodes for p in passes]),
                       num_sampled_edges=np.concatenate([p.num_sampled_edges for p in passes]))


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _mix64_array(z: np.ndarray) -> np.ndarray:
    """``_mix64`` on a uint64 array (numpy wraps array arithmetic mod 2^64 without warning)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


mix64_array = _mix64_array
"""The finalizer on uint64 arrays, public: ``link_sampling`` draws its negatives with the RNG specified here."""


def batch_keys(seed: int, stream: int, epoch: int, pass_index: int, first_batch: int, num_batches: int
               ) -> np.ndarray:
    """One uint64 key per batch ``first_batch .. first_batch + num_batches - 1``, a pure function of the arguments.

    ``stream`` separates train, val, test and any other sampling streams; the derivation is
    in the module docstring. Negative seed/stream/epoch/pass_index are taken mod 2^64.
    """
    first = as_int("first_batch", first_batch)
    count = as_int("num_batches", num_batches)
    if first < 0:
        raise ValueError(f"first_batch: {first} is negative")
    if count < 0:
        raise ValueError(f"num_batches: {count} is negative")
    counters = np.arange(first + 1, first + count + 1, dtype=np.uint64)
    return _mix64_array(np.uint64(_stream_base(seed, stream, epoch, pass_index)) + counters * np.uint64(_GAMMA))


def _stream_base(seed: int, stream: int, epoch: int, pass_index: int) -> int:
    base = _mix64(as_int("seed", seed) & _MASK)
    for name, value in (("stream", stream), ("epoch", epoch), ("pass_index", pass_index)):
        base = _mix64(base ^ _mix64((as_int(name, value) + _GAMMA) & _MASK))
    return base


def position_keys(seed: int, stream: int, epoch: int, positions: np.ndarray) -> np.ndarray:
    """uint64 keys of arbitrary non-negative positions: key i is ``batch_keys(seed, stream, epoch, 0, p, 1)[0]``
    for p = positions[i], without the arange in between (a draw per item of a scattered set, e.g. an edge's)."""
    where = as_int_array("positions", positions, (np.int64,))
    if where.size and where.min() < 0:
        raise ValueError(f"positions: {where.min()} is negative")
    counters = where.astype(np.uint64) + np.uint64(1)
    return _mix64_array(np.uint64(_stream_base(seed, stream, epoch, 0)) + counters * np.uint64(_GAMMA))


def key_shares(keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """int64: key i's share among counts[i] equal shares, floor(k_hi * counts[i] / 2^32) with k_hi the key's top 32
    bits (exact integer arithmetic; counts in [1, 2^32)), so a uniform key falls in each share with probability
    1 / counts[i] (to within counts[i] / 2^32)."""
    many = np.asarray(counts, dtype=np.int64)
    if many.size and (many.min() < 1 or many.max() >= 1 << 32):
        raise ValueError(f"counts: {many.min()}..{many.max()}, expected within [1, 2^32)")
    top = np.asarray(keys, dtype=np.uint64) >> np.uint64(32)
    return ((top * many.astype(np.uint64)) >> np.uint64(32)).astype(np.int64)


def shuffle(ids: np.ndarray, key: int) -> np.ndarray:
    """A permuted copy of ``ids``, determined by ``key`` (in [0, 2^64)) through PCG64."""
    return np.random.Generator(np.random.PCG64(int(key))).permutation(ids)


def _keys_array(keys: np.ndarray, num_batches: int) -> np.ndarray:
    array = as_int_array("keys", keys, (np.uint64,)) if np.asarray(keys).dtype.kind == "u" else None
    if array is None:
        signed = as_int_array("keys", keys, (np.int64,))
        if signed.size and signed.min() < 0:
            raise ValueError(f"keys: negative key {signed.min()}; keys are uint64")
        array = signed.astype(np.uint64)
    if len(array) != num_batches:
        raise ValueError(f"keys: length {len(array)}, expected one per batch = {num_batches}")
    return array


def _capacity_guess(num_seeds: int, num_batches: int, fanouts: np.ndarray, graph: CSCGraph) -> tuple[int, int]:
    """First guesses for the node and edge buffers: the fanout product bound, capped."""
    mean_degree = -(-graph.num_edges // graph.num_nodes) if graph.num_nodes else 0
    frontier, nodes, edges = num_seeds, num_seeds, 0
    for fanout in fanouts.tolist():
        frontier = min(frontier * (mean_degree if fanout < 0 else fanout), num_batches * graph.num_nodes)
        edges += frontier
        nodes = min(nodes + frontier, num_batches * graph.num_nodes)
    return min(nodes, _INITIAL_CAPACITY_CAP), min(edges, _INITIAL_CAPACITY_CAP)


def check_pass_args(seeds: np.ndarray, batch_size: int, fanouts: Sequence[int], keys: np.ndarray, num_nodes: int
                    ) -> tuple[np.ndarray, int, list[int], np.ndarray]:
    """The validated (int64 seeds, batch size, fanouts, uint64 keys) of a pass over ``num_nodes`` nodes.

    Shared by every sampler so bad input gets the same ValueError, naming the field, from each.
    """
    seed_array = as_int_array("seeds", seeds, (np.int64,))
    size = as_int("batch_size", batch_size)
    if size < 1:
        raise ValueError(f"batch_size: {size}, expected >= 1")
    fanout_list = [as_int("fanouts", fanout) for fanout in fanouts]
    if any(fanout < -1 for fanout in fanout_list):
        raise ValueError(f"fanouts: {fanout_list}, each must be >= 0 or -1 (all neighbours)")
    if seed_array.size and (seed_array.min() < 0 or seed_array.max() >= num_nodes):
        bad = seed_array[(seed_array < 0) | (seed_array >= num_nodes)][0]
        raise ValueError(f"seeds: local id {bad} outside [0, {num_nodes})")
    return seed_array, size, fanout_list, _keys_array(keys, -(-len(seed_array) // size))


def sample_pass(graph: CSCGraph, seeds: np.ndarray, batch_size: int, fanouts: Sequence[int], keys: np.ndarray
                ) -> SampledPass:
    """Sample every batch of a pass (see the module docstring for the semantics).

    seeds: local ids in batch order, cut into consecutive batches of ``batch_size`` (the last
    may be smaller), distinct within a batch; fanouts[h]: most neighbours per target at hop
    h+1, -1 for all; keys: one uint64 per batch (``batch_keys``). Releases the GIL throughout
    the kernel, so a worker thread can run it beside an event loop.
    """
    if not isinstance(graph, CSCGraph):
        raise ValueError(f"graph: expected a CSCGraph, got {type(graph).__name__}")
    num_local = graph.num_nodes
    seed_array, size, fanout_list, key_array = check_pass_args(seeds, batch_size, fanouts, keys, num_local)
    num_batches = len(key_array)
    fanout_array = np.array(fanout_list, dtype=np.int64)
    mark = np.full(num_local, -1, dtype=np.int32 if num_local < 2**31 else np.int64)
    node_capacity, edge_capacity = _capacity_guess(len(seed_array), num_batches, fanout_array, graph)
    (status, detail0, detail1, node_ptr, nodes, edge_ptr, edge_src, edge_dst, num_nodes, num_edges
     ) = sample_pass_kernel(graph.indptr, graph.indices, graph.global_ids, seed_array, size, fanout_array,
                            key_array, mark, node_capacity, edge_capacity)
    if status == STATUS_DUPLICATE_SEED:
        raise ValueError(f"seeds: local id {detail1} occurs twice in batch {detail0}")
    if status == STATUS_BAD_NEIGHBOUR:
        raise ValueError(f"indices: in-neighbour {detail1} of local node {detail0} is outside [0, {num_local})")
    return SampledPass(num_batches=num_batches, num_hops=len(fanout_list), node_ptr=node_ptr, nodes=nodes,
                       edge_ptr=edge_ptr, edge_src=edge_src, edge_dst=edge_dst, num_sampled_nodes=num_nodes,
                       num_sampled_edges=num_edges)
