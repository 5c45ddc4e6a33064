"""numba kernels of the exact out-of-core sampler and the neighbour reader (pure functions on numpy arrays).

Semantics are ``loader.sampling.sampling``'s; the hop-major group layout they work on is described in
``loader.sampling.exact_sampling``. The Floyd sampler and the RNG are ``loader.sampling.sampling_kernels``'s own
functions, so both samplers draw from one implementation.

Group layout (G batches, L hops): ``gnodes`` holds the group's nodes level by level (level 0
the seeds, level l the nodes first reached at hop l), batch g's level-l nodes at
``gnodes[nptr[l, g]:nptr[l, g + 1]]``; hop h's edges of batch g are
``gsrc/gdst[eptr[h, g]:eptr[h, g + 1]]``, already in batch-local positions.

A hop's neighbour lists live in two arrays addressed as one: a position p below ``cache_len``
is ``cache_lists[p]``, any other is ``read_lists[p - cache_len]``. Cached lists are thus read
in place, never copied per hop.
"""

import numpy as np

from loader.sampling.sampling_kernels import GAMMA, _grown, _pick_positions, mix64, number_first_seen
from proto.jit import kernel

__all__ = ["scatter_lists", "first_duplicate_seed", "frontier_union", "sample_group_hop", "append_group",
           "STATUS_OK", "STATUS_BAD_NEIGHBOUR"]

STATUS_OK = 0
STATUS_BAD_NEIGHBOUR = 2
"""An in-neighbour id is outside [0, N); details: (target, neighbour). Same code as
``loader.sampling.sampling_kernels``."""


@kernel
def scatter_lists(source: np.ndarray, source_offsets: np.ndarray, dest: np.ndarray, dest_offsets: np.ndarray,
                  nbytes: np.ndarray) -> None:
    """Copy ``nbytes[i]`` bytes from ``source[source_offsets[i]:]`` to ``dest[dest_offsets[i]:]`` (uint8 arrays).

    Bytes, not entries: a staged list may start at any byte the ``.npy`` header leaves it at.
    """
    for i in range(nbytes.shape[0]):
        s = source_offsets[i]
        d = dest_offsets[i]
        n = nbytes[i]
        dest[d:d + n] = source[s:s + n]


@kernel
def first_duplicate_seed(seeds: np.ndarray, batch_size: int, mark: np.ndarray) -> tuple[int, int]:
    """(batch, seed) of the first seed repeated within its batch, or (-1, -1); ``mark`` (all -1) is left all -1."""
    num_seeds = seeds.shape[0]
    for first in range(0, num_seeds, batch_size):
        last = min(first + batch_size, num_seeds)
        found = -1
        for i in range(first, last):
            if mark[seeds[i]] >= 0:
                found = i
                break
            mark[seeds[i]] = 0
        stop = last if found < 0 else found
        for i in range(first, stop):
            mark[seeds[i]] = -1
        if found >= 0:
            return first // batch_size, seeds[found]
    return -1, -1


@kernel
def frontier_union(gnodes: np.ndarray, begin: int, end: int, slot: np.ndarray) -> np.ndarray:
    """The distinct nodes of ``gnodes[begin:end]``, ascending; sets ``slot[u[k]] = k`` for them.

    ``slot`` (length N, all -1 outside the result) deduplicates in O(frontier) and then maps a
    node to its place in the union; the caller resets the result's entries to -1.
    """
    union = np.empty(end - begin, dtype=np.int64)
    count = 0
    for j in range(begin, end):
        v = gnodes[j]
        if slot[v] < 0:
            slot[v] = 0
            union[count] = v
            count += 1
    union = np.sort(union[:count])
    for k in range(count):
        slot[union[k]] = k
    return union


@kernel
def _relabel_two_sources(src: np.ndarray, cache_lists: np.ndarray, cache_len: int, read_lists: np.ndarray,
                         mark: np.ndarray, out_nodes: np.ndarray, out_at: int, count: int) -> tuple[int, int]:
    """``loader.sampling.sampling_kernels._relabel`` over the two-array list space; new nodes go to
    ``out_nodes[out_at:]``.

    Returns the batch's new node count and the index in ``src`` of the first neighbour outside
    [0, N), or -1. As there, ids are fetched in a tight loop first, so the CPU overlaps the misses.
    """
    for e in range(src.shape[0]):
        p = src[e]
        src[e] = cache_lists[p] if p < cache_len else read_lists[p - cache_len]
    # node number ``count`` (the first new one) goes to out_nodes[out_at]
    return number_first_seen(src, mark, out_nodes, out_at - count, count)


@kernel
def sample_group_hop(h: int, fanout: int, group_keys: np.ndarray, gnodes: np.ndarray, nptr: np.ndarray,
                     gsrc: np.ndarray, gdst: np.ndarray, eptr: np.ndarray, slot: np.ndarray, list_starts: np.ndarray,
                     list_degrees: np.ndarray, cache_lists: np.ndarray, read_lists: np.ndarray, mark: np.ndarray,
                     table: np.ndarray, chosen: np.ndarray) -> tuple[int, int, int, np.ndarray, np.ndarray, np.ndarray]:
    """Hop h (0-based) of every batch in the group: pick from level h, append level h+1 and hop h's edges.

    Needs ``nptr[0..h]`` filled and ``eptr[0, 0]``; fills ``nptr[h+1]`` and ``eptr[h]``.
    ``slot`` maps each level-h node to its union index k, whose list is ``list_degrees[k]``
    entries from position ``list_starts[k]`` (two-array space, module docstring); untouched
    when ``fanout == 0``. ``mark`` (all -1) is rebuilt from each batch's earlier levels and
    reset after it, so a batch costs O(its nodes + its hop edges), never O(N).

    Returns (status, detail0, detail1, gnodes, gsrc, gdst), the buffers possibly grown (at
    least doubled, so a pass that reuses them reallocates a few times at most); on a non-zero
    status ``mark`` is still all -1.
    """
    num_group = group_keys.shape[0]
    num_nodes = mark.shape[0]
    cache_len = cache_lists.shape[0]
    if h > 0:
        eptr[h, 0] = eptr[h - 1, num_group]
    level_begin = nptr[h, 0]
    level_end = nptr[h, num_group]
    width = level_end - level_begin
    starts = np.empty(width, dtype=np.int64)
    degrees = np.zeros(width, dtype=np.int64)
    target_keys = np.empty(width, dtype=np.uint64)
    new_bound = 0
    for g in range(num_group):
        hop_key = mix64(group_keys[g] + np.uint64(h + 1) * GAMMA)
        batch_edges = 0
        if fanout != 0:
            for j in range(nptr[h, g], nptr[h, g + 1]):
                v = gnodes[j]
                k = slot[v]
                i = j - level_begin
                degree = list_degrees[k]
                starts[i] = list_starts[k]
                degrees[i] = degree
                if fanout < 0 or degree <= fanout:
                    batch_edges += degree
                else:
                    batch_edges += fanout
                    target_keys[i] = mix64(hop_key ^ mix64(np.uint64(v)))
        eptr[h, g + 1] = eptr[h, g] + batch_edges
        batch_count = 0
        for level in range(h + 1):
            batch_count += nptr[level, g + 1] - nptr[level, g]
        new_bound += min(batch_edges, num_nodes - batch_count)
    edge_begin = eptr[h, 0]
    edge_end = eptr[h, num_group]
    gsrc = _grown(gsrc, edge_begin, edge_end, 0)
    gdst = _grown(gdst, edge_begin, edge_end, gsrc.shape[0])
    gnodes = _grown(gnodes, level_end, level_end + new_bound, 0)
    out_at = level_end
    for g in range(num_group):
        nptr[h + 1, g] = out_at
        e0 = eptr[h, g]
        e1 = eptr[h, g + 1]
        if e1 == e0:
            continue
        count = 0
        for level in range(h + 1):
            for j in range(nptr[level, g], nptr[level, g + 1]):
                mark[gnodes[j]] = count
                count += 1
        frontier_width = nptr[h, g + 1] - nptr[h, g]
        hop_begin = count - frontier_width
        i0 = nptr[h, g] - level_begin
        i1 = i0 + frontier_width
        _pick_positions(starts[i0:i1], degrees[i0:i1], target_keys[i0:i1], hop_begin, fanout, table, chosen,
                        gsrc[e0:e1], gdst[e0:e1])
        new_count, bad = _relabel_two_sources(gsrc[e0:e1], cache_lists, cache_len, read_lists, mark,
                                              gnodes, out_at, count)
        for level in range(h + 1):
            for j in range(nptr[level, g], nptr[level, g + 1]):
                mark[gnodes[j]] = -1
        for j in range(out_at, out_at + new_count - count):
            mark[gnodes[j]] = -1
        if bad >= 0:
            target = gnodes[nptr[h, g] + gdst[e0 + bad] - hop_begin]
            return STATUS_BAD_NEIGHBOUR, target, gsrc[e0 + bad], gnodes, gsrc, gdst
        out_at += new_count - count
    nptr[h + 1, num_group] = out_at
    return STATUS_OK, 0, 0, gnodes, gsrc, gdst


@kernel
def append_group(first_batch: int, gnodes: np.ndarray, nptr: np.ndarray, gsrc: np.ndarray, gdst: np.ndarray,
                 eptr: np.ndarray, nodes: np.ndarray, node_used: int, edge_src: np.ndarray, edge_dst: np.ndarray,
                 edge_used: int, node_ptr: np.ndarray, edge_ptr: np.ndarray, num_sampled_nodes: np.ndarray,
                 num_sampled_edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Copy a finished group into the pass output in batch-major order (the ``SampledPass`` layout).

    Fills ``node_ptr``/``edge_ptr`` entries first_batch+1.. and the per-hop counts; grows the
    output buffers towards the pass total extrapolated from the batches so far. Returns
    (nodes, edge_src, edge_dst, node_used, edge_used).
    """
    num_group = nptr.shape[1] - 1
    num_hops = nptr.shape[0] - 1
    num_batches = node_ptr.shape[0] - 1
    group_nodes = nptr[num_hops, num_group] - nptr[0, 0]
    group_edges = eptr[num_hops - 1, num_group] - eptr[0, 0] if num_hops > 0 else 0
    scale = num_batches / (first_batch + num_group)
    nodes = _grown(nodes, node_used, node_used + group_nodes, int((node_used + group_nodes) * scale))
    edge_src = _grown(edge_src, edge_used, edge_used + group_edges, int((edge_used + group_edges) * scale))
    edge_dst = _grown(edge_dst, edge_used, edge_used + group_edges, edge_src.shape[0])
    for g in range(num_group):
        b = first_batch + g
        for level in range(num_hops + 1):
            begin = nptr[level, g]
            n = nptr[level, g + 1] - begin
            nodes[node_used:node_used + n] = gnodes[begin:begin + n]
            node_used += n
            num_sampled_nodes[b, level] = n
        for h in range(num_hops):
            begin = eptr[h, g]
            n = eptr[h, g + 1] - begin
            edge_src[edge_used:edge_used + n] = gsrc[begin:begin + n]
            edge_dst[edge_used:edge_used + n] = gdst[begin:begin + n]
            edge_used += n
            num_sampled_edges[b, h] = n
        node_ptr[b + 1] = node_used
        edge_ptr[b + 1] = edge_used
    return nodes, edge_src, edge_dst, node_used, edge_used
