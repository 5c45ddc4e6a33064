"""numba kernels for Belady-optimal feature-cache plans and for the row copies that apply them.

The model, the plan format, the algorithm and its proof are in ``loader.caches.changeset``; these
kernels are its hot path and trust the shapes and dtypes that ``loader.caches.changeset`` and
``loader.caches.feature_cache`` validated. Values (ids, slots) are range-checked here, before any
scratch entry is touched, because numba does not bounds-check.
"""

import numpy as np

from proto.jit import kernel

__all__ = ["plan_kernel", "copy_hit_rows", "copy_rows", "STATUS_OK", "STATUS_ID_OUT_OF_RANGE",
           "STATUS_DUPLICATE_ID", "STATUS_PRIOR_ID_OUT_OF_RANGE", "STATUS_PRIOR_SLOT_OUT_OF_RANGE",
           "STATUS_PRIOR_DUPLICATE_ID", "STATUS_PRIOR_DUPLICATE_SLOT", "STATUS_INTERNAL"]

STATUS_OK = 0
STATUS_ID_OUT_OF_RANGE = 1
"""A trace id is outside [0, num_nodes); details: (entry, id)."""
STATUS_DUPLICATE_ID = 2
"""An id occurs twice in one iteration; details: (iteration, id)."""
STATUS_PRIOR_ID_OUT_OF_RANGE = 3
"""A prior id is outside [0, num_nodes); details: (index, id)."""
STATUS_PRIOR_SLOT_OUT_OF_RANGE = 4
"""A prior slot is outside [0, capacity); details: (index, slot)."""
STATUS_PRIOR_DUPLICATE_ID = 5
"""A prior id occurs twice; details: (index, id)."""
STATUS_PRIOR_DUPLICATE_SLOT = 6
"""A prior slot occurs twice; details: (index, slot)."""
STATUS_INTERNAL = 7
"""A broken invariant of the bucket lists (a bug, never bad input); details: (iteration, its hits)."""


@kernel
def _reset(scratch: np.ndarray, trace_ids: np.ndarray, prior_ids: np.ndarray) -> None:
    """Give ``scratch`` back all -1 on an error path: only trace and prior ids can have been written."""
    for i in range(trace_ids.shape[0]):
        scratch[trace_ids[i]] = -1
    for j in range(prior_ids.shape[0]):
        scratch[prior_ids[j]] = -1


@kernel
def _push_head(node: int, bucket: int, head: np.ndarray, tail: np.ndarray, nxt: np.ndarray,
               size: np.ndarray) -> None:
    nxt[node] = head[bucket]
    if head[bucket] < 0:
        tail[bucket] = node
    head[bucket] = node
    size[bucket] += 1


@kernel
def _push_tail(node: int, bucket: int, head: np.ndarray, tail: np.ndarray, nxt: np.ndarray,
               size: np.ndarray) -> None:
    nxt[node] = -1
    if tail[bucket] >= 0:
        nxt[tail[bucket]] = node
    else:
        head[bucket] = node
    tail[bucket] = node
    size[bucket] += 1


@kernel
def _make_room(capacity: int, cached: int, pending: int, top: int, head: np.ndarray, tail: np.ndarray,
               nxt: np.ndarray, size: np.ndarray, id_of: np.ndarray, slot_of: np.ndarray, free: np.ndarray,
               num_free: int, evicted_in: np.ndarray) -> tuple[int, int, int]:
    """Pop heads of the highest non-empty bucket until cached + pending items fit in ``capacity``.

    A popped pending node (index >= capacity) is a bypass: it simply leaves the lists. A popped
    slot is an eviction: its id leaves the cache and the slot goes on the free stack with the
    evicted id remembered for the update record. ``top`` only moves down here and never passes
    a non-empty bucket, since every linked node sits at or below it. Returns (top, cached, num_free).
    """
    total = cached + pending
    while total > capacity:
        while head[top] < 0:
            top -= 1
        node = head[top]
        head[top] = nxt[node]
        if head[top] < 0:
            tail[top] = -1
        size[top] -= 1
        if node < capacity:
            evicted = id_of[node]
            slot_of[evicted] = -1
            id_of[node] = -1
            evicted_in[node] = evicted
            free[num_free] = node
            num_free += 1
            cached -= 1
        total -= 1
    return top, cached, num_free


@kernel
def _settle(capacity: int, pending: int, pending_bucket: np.ndarray, pending_entry: np.ndarray,
            key_ids: np.ndarray, head: np.ndarray, tail: np.ndarray, nxt: np.ndarray, slot_of: np.ndarray,
            id_of: np.ndarray, free: np.ndarray, num_free: int, evicted_in: np.ndarray, out_slots: np.ndarray,
            out_entries: np.ndarray, out_evicted: np.ndarray, count: int) -> tuple[int, int]:
    """Give every surviving pending node a free slot, in place in its list; record each as an insertion.

    Pending nodes enter at the head and pops take heads, so a bucket's survivors are exactly
    the pending prefix of its list: each is swapped for its slot without a predecessor link.
    Records (slot, pending_entry, id the slot held or -1) go to ``out_*[count:]``; the id is
    ``key_ids[pending_entry]``. Returns (num_free, count).
    """
    for p in range(pending):
        bucket = pending_bucket[p]
        node = head[bucket]
        before = -1
        while node >= capacity:  # -1 (end of list) and slots stop the walk
            num_free -= 1
            s = free[num_free]
            after = nxt[node]
            nxt[s] = after
            if before < 0:
                head[bucket] = s
            else:
                nxt[before] = s
            if tail[bucket] == node:
                tail[bucket] = s
            entry = pending_entry[node - capacity]
            v = key_ids[entry]
            slot_of[v] = s
            id_of[s] = v
            out_slots[count] = s
            out_entries[count] = entry
            out_evicted[count] = evicted_in[s]
            evicted_in[s] = -1
            count += 1
            before = s
            node = after
    return num_free, count


@kernel
def plan_kernel(trace_ptr: np.ndarray, trace_ids: np.ndarray, capacity: int, prior_ids: np.ndarray,
                prior_slots: np.ndarray, scratch: np.ndarray, next_iter: np.ndarray, hit_slot: np.ndarray,
                fill_ids: np.ndarray, fill_slots: np.ndarray, fill_evicted: np.ndarray, update_ptr: np.ndarray,
                update_slots: np.ndarray, update_positions: np.ndarray, update_ids: np.ndarray,
                evicted_ids: np.ndarray, id_of: np.ndarray, prefetch: bool = True
                ) -> tuple[int, int, int, int, int, int, int]:
    """Belady's plan for one superbatch (the algorithm of ``loader.caches.changeset``), written into the outputs.

    prefetch: False for a cache that only a batch can feed (no fill reads; S_0 = the prior's
    ids, of which those not accessed in the superbatch are stale and evicted first; a miss not
    accessed again may enter a slot that would otherwise stay free).

    scratch: [num_nodes], all -1 on entry and on return (on every path), first the next-access
    table, then ``slot_of``. next_iter: [L] work space. Outputs: hit_slot [L], fill_* [>= min(C, L)],
    update_ptr [T+1], update_* and evicted_ids [>= L], id_of [C] (the final state, -1 = free).
    Returns (status, detail0, detail1, num_fill, num_hits, num_misses, num_updates); on a
    non-zero status the outputs are partial.
    """
    num_iters = trace_ptr.shape[0] - 1
    length = trace_ids.shape[0]
    num_nodes = scratch.shape[0]
    num_prior = prior_ids.shape[0]
    never = num_iters

    # Every value is checked before scratch is written, so an error here leaves nothing to undo.
    for i in range(length):
        if trace_ids[i] < 0 or trace_ids[i] >= num_nodes:
            return STATUS_ID_OUT_OF_RANGE, i, trace_ids[i], 0, 0, 0, 0
    for j in range(num_prior):
        if prior_ids[j] < 0 or prior_ids[j] >= num_nodes:
            return STATUS_PRIOR_ID_OUT_OF_RANGE, j, prior_ids[j], 0, 0, 0, 0
        if prior_slots[j] < 0 or prior_slots[j] >= capacity:
            return STATUS_PRIOR_SLOT_OUT_OF_RANGE, j, prior_slots[j], 0, 0, 0, 0

    # Pass 1, backwards: scratch[v] = the earliest iteration > t that accesses v seen so far.
    for t in range(num_iters - 1, -1, -1):
        for i in range(trace_ptr[t], trace_ptr[t + 1]):
            v = trace_ids[i]
            seen = scratch[v]
            if seen == t:
                _reset(scratch, trace_ids, prior_ids)
                return STATUS_DUPLICATE_ID, t, v, 0, 0, 0, 0
            next_iter[i] = never if seen < 0 else seen
            scratch[v] = t

    # scratch[v] is now v's first access; the entries where it equals their own iteration
    # are the distinct ids of the trace in first-access order: the fill's candidates.
    prior_first = np.empty(num_prior, dtype=np.int64)
    for j in range(num_prior):
        first = scratch[prior_ids[j]]
        prior_first[j] = never if first < 0 else first
    num_distinct = 0
    max_batch = 0
    for t in range(num_iters):
        max_batch = max(max_batch, trace_ptr[t + 1] - trace_ptr[t])
        for i in range(trace_ptr[t], trace_ptr[t + 1]):
            if scratch[trace_ids[i]] == t:
                num_distinct += 1
    cand_ids = np.empty(num_distinct, dtype=np.int64)
    cand_first = np.empty(num_distinct, dtype=np.int64)
    k = 0
    for t in range(num_iters):
        for i in range(trace_ptr[t], trace_ptr[t + 1]):
            if scratch[trace_ids[i]] == t:
                cand_ids[k] = trace_ids[i]
                cand_first[k] = t
                k += 1
    for k in range(num_distinct):
        scratch[cand_ids[k]] = -1
    slot_of = scratch

    for s in range(capacity):
        id_of[s] = -1
    for j in range(num_prior):
        if slot_of[prior_ids[j]] != -1:
            _reset(scratch, trace_ids, prior_ids)
            return STATUS_PRIOR_DUPLICATE_ID, j, prior_ids[j], 0, 0, 0, 0
        if id_of[prior_slots[j]] != -1:
            _reset(scratch, trace_ids, prior_ids)
            return STATUS_PRIOR_DUPLICATE_SLOT, j, prior_slots[j], 0, 0, 0, 0
        slot_of[prior_ids[j]] = prior_slots[j]
        id_of[prior_slots[j]] = prior_ids[j]

    # Singly linked buckets suffice: nodes leave a list only at its head (pops, the pending
    # prefix) or all at once (bucket t is exactly the hits of iteration t). Nodes 0..C-1 are
    # slots, C.. the pending candidates of the current step.
    max_pending = max(max_batch, num_distinct)
    head = np.full(num_iters + 1, -1, dtype=np.int64)
    tail = np.full(num_iters + 1, -1, dtype=np.int64)
    size = np.zeros(num_iters + 1, dtype=np.int64)
    nxt = np.empty(capacity + max_pending, dtype=np.int64)
    pending_entry = np.empty(max_pending, dtype=np.int64)
    pending_bucket = np.empty(max_pending, dtype=np.int64)
    evicted_in = np.full(capacity, -1, dtype=np.int64)
    free = np.empty(capacity, dtype=np.int64)
    num_free = 0
    for s in range(capacity - 1, -1, -1):  # pushed high to low so the lowest free slot is used first
        if id_of[s] < 0:
            free[num_free] = s
            num_free += 1

    # Fill ("iteration -1"): the prior is the cached state, the distinct ids of the trace are the
    # batch, each with its first access as next access.
    top = 0
    cached = 0
    for j in range(num_prior):
        _push_tail(prior_slots[j], prior_first[j], head, tail, nxt, size)
        top = max(top, prior_first[j])
        cached += 1
    pending = 0
    # Without prefetch nothing is a fill candidate: the prior (at most C ids) is S_0 as it stands.
    for k in range(num_distinct if prefetch else 0):
        if slot_of[cand_ids[k]] < 0:
            # At the head, so that within a bucket a pending candidate is dropped before a cached
            # id is evicted: a tie then keeps the prior and costs no read.
            _push_head(capacity + pending, cand_first[k], head, tail, nxt, size)
            pending_entry[pending] = k
            pending_bucket[pending] = cand_first[k]
            pending += 1
            top = max(top, cand_first[k])
    top, cached, num_free = _make_room(capacity, cached, pending, top, head, tail, nxt, size, id_of, slot_of,
                                       free, num_free, evicted_in)
    num_free, num_fill = _settle(capacity, pending, pending_bucket, pending_entry, cand_ids, head, tail, nxt,
                                 slot_of, id_of, free, num_free, evicted_in, fill_slots, fill_ids, fill_evicted, 0)
    cached += num_fill
    for f in range(num_fill):
        fill_ids[f] = cand_ids[fill_ids[f]]

    num_hits = 0
    num_updates = 0
    update_ptr[0] = 0
    for t in range(num_iters):
        begin = trace_ptr[t]
        pending = 0
        hits = 0
        for i in range(begin, trace_ptr[t + 1]):
            v = trace_ids[i]
            n = next_iter[i]
            s = slot_of[v]
            if s >= 0:
                hit_slot[i] = s
                hits += 1
                # At the tail, so bucket ``never`` lists stale ids least recently used first,
                # and those are evicted first. Bucket t itself is dropped whole below.
                _push_tail(s, n, head, tail, nxt, size)
                top = max(top, n)
            else:
                hit_slot[i] = -1
                # With prefetch an id with no further access is never worth a copy. Without, the next
                # superbatch cannot fill the cache, so it may still take a slot nothing else wants: in
                # bucket ``never`` at the head, it is the first to go (a bypass) when room runs out.
                if n < never or not prefetch:
                    _push_head(capacity + pending, n, head, tail, nxt, size)
                    pending_entry[pending] = i
                    pending_bucket[pending] = n
                    pending += 1
                    top = max(top, n)
        if hits != size[t]:  # bucket t must hold exactly the hits of iteration t
            _reset(scratch, trace_ids, prior_ids)
            return STATUS_INTERNAL, t, hits, 0, 0, 0, 0
        head[t] = -1
        tail[t] = -1
        size[t] = 0
        num_hits += hits
        top, cached, num_free = _make_room(capacity, cached, pending, top, head, tail, nxt, size, id_of,
                                           slot_of, free, num_free, evicted_in)
        first_update = num_updates
        num_free, num_updates = _settle(capacity, pending, pending_bucket, pending_entry, trace_ids, head, tail,
                                        nxt, slot_of, id_of, free, num_free, evicted_in, update_slots,
                                        update_positions, evicted_ids, num_updates)
        cached += num_updates - first_update
        for u in range(first_update, num_updates):
            update_ids[u] = trace_ids[update_positions[u]]
            update_positions[u] -= begin
        update_ptr[t + 1] = num_updates

    for s in range(capacity):
        if id_of[s] >= 0:
            slot_of[id_of[s]] = -1
    return STATUS_OK, 0, 0, num_fill, num_hits, length - num_hits, num_updates


@kernel
def copy_hit_rows(cache: np.ndarray, hit_slot: np.ndarray, out: np.ndarray) -> None:
    """``out[k] = cache[hit_slot[k]]`` wherever ``hit_slot[k] >= 0``; rows of equal width, any word type.

    Element by element, so no temporary is made whatever numba concludes about aliasing.
    """
    width = out.shape[1]
    for k in range(hit_slot.shape[0]):
        s = hit_slot[k]
        if s >= 0:
            for j in range(width):
                out[k, j] = cache[s, j]


@kernel
def copy_rows(src: np.ndarray, src_rows: np.ndarray, dst: np.ndarray, dst_rows: np.ndarray) -> None:
    """``dst[dst_rows[k]] = src[src_rows[k]]`` for every k, element by element (no temporary)."""
    width = dst.shape[1]
    for k in range(src_rows.shape[0]):
        r = src_rows[k]
        d = dst_rows[k]
        for j in range(width):
            dst[d, j] = src[r, j]
