"""numba kernels for multi-hop neighbour sampling of a whole pass (pure functions on numpy arrays).

The semantics, the RNG and the output layout are specified in ``loader.sampling.sampling``; these
kernels are its hot path and trust the arrays that ``CSCGraph`` and ``sample_pass`` validated.
"""

import numpy as np

from proto.jit import kernel

__all__ = ["GAMMA", "mix64", "number_first_seen", "pick_table_size", "sample_pass_kernel", "STATUS_OK",
           "STATUS_DUPLICATE_SEED", "STATUS_BAD_NEIGHBOUR"]

GAMMA = np.uint64(0x9E3779B97F4A7C15)
"""The splitmix64 increment (2^64 / golden ratio, odd)."""
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_SHIFT30 = np.uint64(30)
_SHIFT27 = np.uint64(27)
_SHIFT31 = np.uint64(31)

STATUS_OK = 0
STATUS_DUPLICATE_SEED = 1
"""A seed occurs twice in one batch; details: (batch, seed)."""
STATUS_BAD_NEIGHBOUR = 2
"""An in-neighbour id is outside [0, M); details: (target, neighbour)."""


@kernel
def mix64(z: np.uint64) -> np.uint64:
    """The splitmix64 finalizer (Stafford's variant 13): a bijection of uint64 with full avalanche."""
    z = (z ^ (z >> _SHIFT30)) * _MUL1
    z = (z ^ (z >> _SHIFT27)) * _MUL2
    return z ^ (z >> _SHIFT31)


@kernel
def _grown(buffer: np.ndarray, used: int, need: int, projected: int) -> np.ndarray:
    """``buffer`` itself if it holds ``need`` items, else a larger copy of its first ``used`` items.

    Capacity jumps to the projected pass total (or at least doubles), so a pass grows a couple
    of times at most; pages never written stay unbacked, so spare capacity costs no memory.
    """
    if need <= buffer.shape[0]:
        return buffer
    capacity = max(need, 2 * buffer.shape[0], projected)
    out = np.empty(capacity, dtype=buffer.dtype)
    out[:used] = buffer[:used]
    return out


@kernel
def pick_table_size(fanout: int) -> int:
    """Entries of the open-addressing set in which Floyd's algorithm marks ``fanout`` picks: the smallest power
    of two that is at least 2 and at least ``2 * fanout``, so the set is never more than half full.

    A table this size for the largest fanout of a pass serves every smaller one (``_floyd_positions`` uses
    the first ``pick_table_size(fanout)`` entries)."""
    size = 2
    while size < 2 * fanout:
        size *= 2
    return size


@kernel
def _floyd_positions(degree: int, fanout: int, target_key: np.uint64, table: np.ndarray,
                     chosen: np.ndarray) -> None:
    """Fill ``chosen[:fanout]`` with distinct positions in [0, degree), in Floyd's insertion order.

    Robert Floyd's algorithm needs exactly ``fanout`` draws whatever the degree. Step j draws
    t = draw_j mod (degree - fanout + j + 1) and takes t, or the range's top when t was
    taken already. Membership is an open-addressing set in ``table`` keyed by the low bits
    of the position, which are uniform because positions are drawn uniformly.
    """
    size = pick_table_size(fanout)
    mask = size - 1
    table[:size] = -1
    for j in range(fanout):
        top = degree - fanout + j
        draw = mix64(target_key + np.uint64(j + 1) * GAMMA)
        t = np.int64(draw % np.uint64(top + 1))
        slot = t & mask
        while table[slot] >= 0 and table[slot] != t:
            slot = (slot + 1) & mask
        if table[slot] == t:
            t = np.int64(top)  # every earlier pick is below ``top``, so it is new
            slot = t & mask
            while table[slot] >= 0:
                slot = (slot + 1) & mask
        table[slot] = t
        chosen[j] = t


@kernel
def _plan_hop(indptr: np.ndarray, global_ids: np.ndarray, frontier: np.ndarray, fanout: int, hop_key: np.uint64,
              starts: np.ndarray, degrees: np.ndarray, target_keys: np.ndarray) -> int:
    """Return the hop's exact edge count; fill each frontier target's list start, degree and RNG key.

    A tight loop with no unpredictable branch, so the CPU overlaps the random reads of
    ``indptr`` and ``global_ids`` that ``_pick_positions``, behind Floyd's branches, would
    wait on one by one. Keys are left unset for fanout -1, which draws nothing.
    """
    hop_edges = 0
    for i in range(frontier.shape[0]):
        v = frontier[i]
        start = indptr[v]
        degree = indptr[v + 1] - start
        starts[i] = start
        degrees[i] = degree
        hop_edges += degree if fanout < 0 or degree <= fanout else fanout
        if fanout >= 0:
            target_keys[i] = mix64(hop_key ^ mix64(np.uint64(global_ids[v])))
    return hop_edges


@kernel
def _pick_positions(starts: np.ndarray, degrees: np.ndarray, target_keys: np.ndarray, first_position: int,
                    fanout: int, table: np.ndarray, chosen: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
    """Write the ``indices`` position of every taken in-neighbour of the frontier to ``src``, its target's
    batch position to ``dst``.

    Positions, not neighbour ids: reading the neighbour lists here would stall on a cache miss
    per target behind Floyd's unpredictable branches; ``_relabel`` reads them in a tight loop
    whose misses the CPU overlaps.
    """
    edge = 0
    for i in range(starts.shape[0]):
        start = starts[i]
        degree = degrees[i]
        if fanout < 0 or degree <= fanout:
            for k in range(degree):
                src[edge + k] = start + k
                dst[edge + k] = first_position + i
            edge += degree
        elif fanout > 0:
            _floyd_positions(degree, fanout, target_keys[i], table, chosen)
            for k in range(fanout):
                src[edge + k] = start + chosen[k]
                dst[edge + k] = first_position + i
            edge += fanout


@kernel
def _relabel(src: np.ndarray, indices: np.ndarray, mark: np.ndarray, batch_nodes: np.ndarray, count: int
             ) -> tuple[int, int]:
    """Replace each ``indices`` position in ``src`` by its neighbour's batch position, appending first-seen
    neighbours to ``batch_nodes``.

    Returns the new node count and the index in ``src`` of the first neighbour outside [0, M), or -1.
    """
    for e in range(src.shape[0]):
        src[e] = indices[src[e]]
    return number_first_seen(src, mark, batch_nodes, 0, count)


@kernel
def number_first_seen(src: np.ndarray, mark: np.ndarray, out: np.ndarray, out_base: int, count: int
                      ) -> tuple[int, int]:
    """Replace each node id in ``src`` by its batch position (``mark``, -1 = not in the batch yet),
    numbering first-seen nodes from ``count`` and writing node ``count`` to ``out[out_base + count]``.

    Returns the new node count and the index in ``src`` of the first id outside [0, len(mark)), or -1.
    """
    num_nodes = mark.shape[0]
    for e in range(src.shape[0]):
        u = src[e]
        if u < 0 or u >= num_nodes:
            return count, e
        position = mark[u]
        if position < 0:
            position = count
            mark[u] = count
            out[out_base + count] = u
            count += 1
        src[e] = position
    return count, -1


@kernel
def sample_pass_kernel(indptr: np.ndarray, indices: np.ndarray, global_ids: np.ndarray, seeds: np.ndarray,
                       batch_size: int, fanouts: np.ndarray, keys: np.ndarray, mark: np.ndarray,
                       node_capacity: int, edge_capacity: int
                       ) -> tuple[int, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                  np.ndarray, np.ndarray]:
    """Sample every batch of a pass; see ``loader.sampling.sampling`` for the semantics.

    ``mark`` (length M, all -1) maps a local id to its position in the current batch; only
    the batch's own entries are reset afterwards, so a batch costs O(its output), not O(M).
    The capacities are first guesses for the node and edge buffers.

    Returns (status, detail0, detail1, node_ptr, nodes, edge_ptr, edge_src, edge_dst,
    num_sampled_nodes, num_sampled_edges); on a non-zero status the arrays are partial and
    ``mark`` is still all -1.
    """
    num_seeds = seeds.shape[0]
    num_batches = keys.shape[0]
    num_hops = fanouts.shape[0]
    num_local = global_ids.shape[0]
    node_ptr = np.zeros(num_batches + 1, dtype=np.int64)
    edge_ptr = np.zeros(num_batches + 1, dtype=np.int64)
    num_nodes = np.zeros((num_batches, num_hops + 1), dtype=np.int64)
    num_edges = np.zeros((num_batches, num_hops), dtype=np.int64)
    nodes = np.empty(max(node_capacity, 1), dtype=np.int64)
    edge_src = np.empty(max(edge_capacity, 1), dtype=np.int64)
    edge_dst = np.empty(max(edge_capacity, 1), dtype=np.int64)
    max_fanout = 1
    for h in range(num_hops):
        max_fanout = max(max_fanout, fanouts[h])
    table = np.empty(pick_table_size(max_fanout), dtype=np.int64)
    chosen = np.empty(max_fanout, dtype=np.int64)
    starts = np.empty(1, dtype=np.int64)
    degrees = np.empty(1, dtype=np.int64)
    target_keys = np.empty(1, dtype=np.uint64)
    status = 0
    detail0 = 0
    detail1 = 0
    base = 0
    edge_count = 0
    for b in range(num_batches):
        first = b * batch_size
        last = min(first + batch_size, num_seeds)
        nodes = _grown(nodes, base, base + last - first, 0)
        count = 0
        for i in range(first, last):
            s = seeds[i]
            if mark[s] >= 0:
                status, detail0, detail1 = 1, b, s
                break
            mark[s] = count
            nodes[base + count] = s
            count += 1
        num_nodes[b, 0] = count
        hop_begin = 0
        hop_end = count
        for h in range(num_hops):
            if status != 0:
                break
            fanout = fanouts[h]
            hop_key = mix64(keys[b] + np.uint64(h + 1) * GAMMA)
            frontier = nodes[base + hop_begin:base + hop_end]
            width = frontier.shape[0]
            starts = _grown(starts, 0, width, 0)
            degrees = _grown(degrees, 0, width, 0)
            target_keys = _grown(target_keys, 0, width, 0)
            # The hop's exact edge count sizes both buffers up front; the loops below need no checks.
            hop_edges = _plan_hop(indptr, global_ids, frontier, fanout, hop_key, starts, degrees, target_keys)
            new_bound = min(hop_edges, num_local - count)
            scale = num_batches / (b + 1)  # extrapolates the pass total from the batches so far
            nodes = _grown(nodes, base + count, base + count + new_bound, int((base + count + new_bound) * scale))
            edge_src = _grown(edge_src, edge_count, edge_count + hop_edges, int((edge_count + hop_edges) * scale))
            edge_dst = _grown(edge_dst, edge_count, edge_count + hop_edges, edge_src.shape[0])
            hop_src = edge_src[edge_count:edge_count + hop_edges]
            _pick_positions(starts[:width], degrees, target_keys, hop_begin, fanout, table, chosen, hop_src,
                            edge_dst[edge_count:edge_count + hop_edges])
            count, bad = _relabel(hop_src, indices, mark, nodes[base:], count)
            if bad >= 0:
                status, detail0, detail1 = 2, nodes[base + edge_dst[edge_count + bad]], hop_src[bad]
            edge_count += hop_edges
            num_nodes[b, h + 1] = count - hop_end
            num_edges[b, h] = hop_edges
            hop_begin = hop_end
            hop_end = count
        for i in range(count):
            mark[nodes[base + i]] = -1
        if status != 0:
            break
        base += count
        node_ptr[b + 1] = base
        edge_ptr[b + 1] = edge_count
    return (status, detail0, detail1, node_ptr, nodes[:base], edge_ptr, edge_src[:edge_count],
            edge_dst[:edge_count], num_nodes, num_edges)
