"""The Ginex neighbour cache (§3.2, Fig. 10): in-neighbour lists of the most valuable nodes, in RAM.

Structure (direct addressing): ``address`` is int64 [N], the start of node v's list in
``lists`` or -1 when v is not cached; ``lists`` concatenates the cached lists in node-id order.
Lookup is one load of ``address[v]``; the length comes from ``indptr``, which the exact sampler
holds anyway, so unlike Ginex's cache array no length word precedes each list.

Which nodes: the prefix of the prepared ``neighbor_rank.npy`` (decreasing out/in degree, nodes
with no in-neighbours first) that fits the byte budget. Filling **stops at the first list that
does not fit** rather than skipping it for smaller ones further down: the cached set is then
always a prefix of the ranking, so a larger budget caches a superset and the policy is the
documented one ("filled from the front", docs/FORMAT.md); at most one list's worth of budget
goes unused.

Budget accounting: ``nbytes`` = address table (8 N bytes) + cached lists. A budget below the
table's size gives the empty cache, which holds no table at all (``nbytes == 0``, every
lookup misses); budget 0 is therefore valid.

Building costs O(N) time and two transient int64 [N] arrays (the ranking and its running
byte total), then reads only the chosen lists, ascending by id, through ``NeighborReader``
in chunks of at most ``chunk_bytes`` straight into ``lists``: never the whole ``indices``
file unless the budget covers it. The cache is immutable once built; hit and miss counts are
the caller's (the exact sampler counts them per fetched list).
"""

import numpy as np
import numpy.typing as npt

from loader.sampling.neighbor_reader import NeighborReader

__all__ = ["NeighborCache", "ADDRESS_BYTES_PER_NODE", "DEFAULT_CHUNK_BYTES"]

ADDRESS_BYTES_PER_NODE = 8
"""One int64 address-table entry per node."""
DEFAULT_CHUNK_BYTES = 64 << 20
"""Default list bytes read per build step: bounds the reader's staging buffer while filling."""


class NeighborCache:
    """Direct-addressed in-neighbour lists; see the module docstring.

    indptr: int64 [N+1], the CSC offsets (held, not copied: list lengths come from it);
    address: int64 [N] (-1 = not cached) or int64 [0] for the empty cache; lists: int32 or
    int64, the cached lists concatenated. Use ``build`` (or ``empty``) rather than the
    constructor, which only checks shapes (O(1)).
    """

    def __init__(self, indptr: np.ndarray, address: np.ndarray, lists: np.ndarray) -> None:
        num_nodes = len(indptr) - 1
        if indptr.dtype != np.int64 or indptr.ndim != 1 or num_nodes < 0:
            raise ValueError(f"indptr: {indptr.dtype} {indptr.shape}, expected int64 [N+1]")
        if address.dtype != np.int64 or address.ndim != 1 or len(address) not in (0, num_nodes):
            raise ValueError(f"address: {address.dtype} {address.shape}, expected int64 ({num_nodes},) or (0,)")
        if lists.ndim != 1 or lists.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise ValueError(f"lists: {lists.dtype} {lists.shape}, expected a 1-D int32 or int64 array")
        if len(address) == 0 and len(lists):
            raise ValueError(f"lists: {len(lists)} entries but no address table")
        self.indptr = indptr
        self.address = address
        self.lists = lists
        self.num_nodes = num_nodes
        self.num_cached = int(np.count_nonzero(address >= 0))

    @classmethod
    def empty(cls, indptr: np.ndarray, dtype: npt.DTypeLike = np.int32) -> "NeighborCache":
        """The cache of budget 0: no table, every lookup misses."""
        return cls(indptr, np.empty(0, dtype=np.int64), np.empty(0, dtype=dtype))

    @classmethod
    def build(cls, neighbor_rank: npt.ArrayLike, reader: NeighborReader, budget_bytes: int, *,
              chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> "NeighborCache":
        """Cache the longest prefix of ``neighbor_rank`` whose lists fit ``budget_bytes`` with the table.

        neighbor_rank: int64 [N], the prepared ranking (a permutation of the node ids; only the
        chosen prefix is checked for repeats); reader: reads the chosen lists (and gives
        ``indptr`` and the index dtype); chunk_bytes (default 64 MiB): list bytes per read step.
        """
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int | np.integer) or budget_bytes < 0:
            raise ValueError(f"budget_bytes: {budget_bytes!r}, expected an integer >= 0")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes: {chunk_bytes}, expected >= 1")
        indptr = reader.indptr
        num_nodes = len(indptr) - 1
        rank = np.asarray(neighbor_rank)
        if rank.ndim != 1 or len(rank) != num_nodes or (rank.size and rank.dtype.kind not in "iu"):
            raise ValueError(f"neighbor_rank: {rank.dtype} {rank.shape}, expected int64 ({num_nodes},)")
        table_bytes = ADDRESS_BYTES_PER_NODE * num_nodes
        if budget_bytes < table_bytes or num_nodes == 0:
            return cls.empty(indptr, reader.dtype)
        rank = rank.astype(np.int64, copy=False)
        if rank.min() < 0 or rank.max() >= num_nodes:
            bad = rank[(rank < 0) | (rank >= num_nodes)][0]
            raise ValueError(f"neighbor_rank: node {bad} outside [0, {num_nodes})")
        itemsize = reader.dtype.itemsize
        running = np.cumsum((indptr[rank + 1] - indptr[rank]) * itemsize)
        count = int(np.searchsorted(running, budget_bytes - table_bytes, side="right"))
        del running
        chosen = np.sort(rank[:count])
        if count > 1 and np.diff(chosen).min() == 0:
            raise ValueError("neighbor_rank: a node occurs twice (expected a permutation)")
        del rank
        degrees = indptr[chosen + 1] - indptr[chosen]
        starts = np.cumsum(degrees) - degrees
        address = np.full(num_nodes, -1, dtype=np.int64)
        address[chosen] = starts
        lists = np.empty(int(degrees.sum()), dtype=reader.dtype)
        # Chunks cut at node boundaries, each at most ``chunk_bytes`` of lists (or one longer list).
        bounds = np.searchsorted(starts * itemsize, np.arange(0, len(lists) * itemsize, chunk_bytes), side="left")
        bounds = np.unique(np.append(bounds, count))
        begin = 0
        for end in bounds.tolist():
            if end > begin:
                first, stop = int(starts[begin]), int(starts[end - 1] + degrees[end - 1])
                reader.read_into(chosen[begin:end], lists[first:stop])
                begin = end
        reader.release_staging()
        return cls(indptr, address, lists)

    @property
    def nbytes(self) -> int:
        """Bytes held: address table + cached lists."""
        return self.address.nbytes + self.lists.nbytes

    @property
    def has_table(self) -> bool:
        return len(self.address) > 0

    def lookup(self, nodes: npt.ArrayLike) -> np.ndarray:
        """int64 start in ``lists`` of each node's list, -1 where not cached (vectorized, O(k))."""
        ids = np.asarray(nodes, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
            bad = ids[(ids < 0) | (ids >= self.num_nodes)][0]
            raise ValueError(f"nodes: node {bad} outside [0, {self.num_nodes})")
        if not self.has_table:
            return np.full(ids.shape, -1, dtype=np.int64)
        return self.address[ids]

    def get(self, node: int) -> np.ndarray | None:
        """Node ``node``'s list (a view into ``lists``), or None when it is not cached."""
        start = int(self.lookup(np.array([node]))[0])
        if start < 0:
            return None
        return self.lists[start:start + int(self.indptr[node + 1] - self.indptr[node])]
