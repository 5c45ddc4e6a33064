"""Read the in-neighbour lists of any set of nodes from ``indices.npy`` with coalesced ``preadv`` calls.

The exact out-of-core sampler (``loader.sampling.exact_sampling``) keeps only ``indptr`` in RAM; every
list the neighbour cache misses comes through here. A request is a strictly ascending array of
node ids; the answer is their lists concatenated in that order (``NeighborLists``).

How a request becomes reads (all planning is vectorized numpy, O(k) for k nodes):

* Node v's list is the byte range ``data_offset + itemsize * [indptr[v], indptr[v+1])``; empty
  lists cost nothing. With O_DIRECT each range is first widened to 4096-byte boundaries.
* Ranges whose gap is at most ``gap_bytes`` are coalesced into one read: on an SSD one read
  of a few extra KiB costs less than a second request, and ascending ids make neighbours in
  the file neighbours in the request.
* A coalesced range longer than ``block_bytes`` is split, so one huge list still spreads over
  the read threads. The reads are dealt round-robin to ``read_threads`` tasks on a
  ``ThreadPoolExecutor``; ``preadv`` releases the GIL, so that many reads are in flight.
* Buffered reads of a range without gaps land straight in the output array; ranges with gaps,
  and every O_DIRECT read, land in a page-aligned staging buffer (``mmap.mmap(-1, n)``, reused
  and grown across calls) from which a numba kernel copies each list to its place.
* The staged ranges go through that buffer in rounds of at most ``staging_cap`` bytes (a range is cut
  where a ``staging_cap`` window of the file ends, between two lists), so the buffer never exceeds
  ``max_staging_bytes``: the cap plus the longest list's pages. Without rounds it grew to the sum of
  a request's widened ranges, which for a sample group's frontier on bench/compare's 2M-node graph
  (82k lists of 80 B, each its own 4 KiB page) was 90 MiB touched of a 180 MiB mapping: shared
  memory no memory plan charged.

O_DIRECT (``direct_io=True``) bypasses the page cache, so reads measure the device. A
filesystem that refuses it (EINVAL at ``open`` or at a probe read, as tmpfs does) is logged
once and read through the page cache instead; ``direct_io`` then reads False.

Counters (cumulative, plain ints, updated by the calling thread after each request):
``read_calls`` (``preadv`` calls), ``bytes_read`` (bytes those calls returned, gaps and
alignment padding included), ``lists_read`` (non-empty lists delivered) and ``list_bytes``
(their bytes: ``bytes_read / list_bytes`` is the read amplification). One reader serves one
request at a time (a lock serializes callers), because the staging buffer is shared.
"""

import errno
import logging
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt

from loader.format.fileio import read_failed
from loader.format.npyio import NpyReader
from loader.format.read_checks import PAGE_BYTES, verify_blocks
from loader.sampling.exact_sampling_kernels import scatter_lists
from proto.errors import UserError

__all__ = ["NeighborLists", "NeighborReader", "ALIGNMENT", "DEFAULT_GAP_BYTES", "DEFAULT_BLOCK_BYTES",
           "DEFAULT_READ_THREADS", "DEFAULT_STAGING_CAP", "staging_bound", "max_degree"]

log = logging.getLogger("megabatch.neighbor_reader")

ALIGNMENT = 4096
"""O_DIRECT offset, length and buffer alignment (the page size; enough for every common device)."""
DEFAULT_GAP_BYTES = 4096
"""Default coalescing gap: reading one more page is cheaper than issuing another request."""
DEFAULT_STAGING_CAP = 8 << 20
"""Staged bytes per round of reads (``staging_cap``): 1 MiB blocks on 8 threads still fill it many times over."""
DEFAULT_BLOCK_BYTES = 1 << 20
"""Default largest single read; longer coalesced ranges are split so they spread over threads."""
DEFAULT_READ_THREADS = 8
"""Default read pool size: reads in flight at once (an NVMe drive wants several)."""


@dataclass(frozen=True)
class NeighborLists:
    """The in-neighbour lists of k nodes, concatenated: node i's list is ``lists[offsets[i]:offsets[i+1]]``.

    offsets: int64 [k+1] from 0; lists: the file's index dtype (int32 or int64).
    """

    offsets: np.ndarray
    lists: np.ndarray

    def __post_init__(self) -> None:
        if self.offsets.dtype != np.int64 or self.offsets.ndim != 1 or len(self.offsets) == 0:
            raise ValueError(f"offsets: {self.offsets.dtype} {self.offsets.shape}, expected int64 [k+1]")
        if self.lists.ndim != 1 or int(self.offsets[-1]) != len(self.lists):
            raise ValueError(f"lists: shape {self.lists.shape}, expected ({int(self.offsets[-1])},) = offsets[-1]")

    @property
    def num_lists(self) -> int:
        return len(self.offsets) - 1

    def list(self, i: int) -> np.ndarray:
        """Node i's list (a view)."""
        return self.lists[self.offsets[i]:self.offsets[i + 1]]


def _check_indptr(indptr: np.ndarray) -> np.ndarray:
    array = np.asarray(indptr)
    if array.ndim != 1 or len(array) == 0:
        raise ValueError(f"indptr: expected a 1-D array of N+1 >= 1 entries, got shape {array.shape}")
    if array.dtype != np.int64:
        if array.dtype.kind not in "iu" or not np.can_cast(array.dtype, np.int64, "safe"):
            raise ValueError(f"indptr: dtype {array.dtype}, expected int64")
        array = array.astype(np.int64)
    if array[0] != 0:
        raise ValueError(f"indptr: first entry is {array[0]}, expected 0")
    return np.ascontiguousarray(array)


def _sorted_node_ids(field: str, nodes: npt.ArrayLike, num_nodes: int) -> np.ndarray:
    """``nodes`` as int64, checked strictly ascending and inside [0, num_nodes) (O(k))."""
    array = np.asarray(nodes)
    if array.ndim != 1:
        raise ValueError(f"{field}: expected a 1-D array, got shape {array.shape}")
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.dtype.kind not in "iu" or not np.can_cast(array.dtype, np.int64, "safe"):
        raise ValueError(f"{field}: expected integer node ids, got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.int64)
    if array[0] < 0 or array[-1] >= num_nodes:
        bad = array[0] if array[0] < 0 else array[-1]
        raise ValueError(f"{field}: node {bad} outside [0, {num_nodes})")
    steps = np.diff(array)
    if steps.size and steps.min() <= 0:
        i = int(np.argmax(steps <= 0))
        raise ValueError(f"{field}: not strictly ascending ({array[i]} then {array[i + 1]} at position {i})")
    return array


def staging_bound(max_degree: int, itemsize: int, file_bytes: int, staging_cap: int = DEFAULT_STAGING_CAP) -> int:
    """Most bytes a reader's staging buffer maps (``NeighborReader.max_staging_bytes``) for lists of at most
    ``max_degree`` entries of ``itemsize`` bytes in a file of ``file_bytes``: a round's cap, the pages of a list
    that starts just before a window of the file ends (a range runs on to its last list's end) and one more page
    for its start; never more than the file's pages (and a page) a request can widen to."""
    cap = -(-staging_cap // ALIGNMENT) * ALIGNMENT
    rounds = cap + -(-max_degree * itemsize // ALIGNMENT) * ALIGNMENT + 2 * ALIGNMENT
    return min(rounds, -(-file_bytes // ALIGNMENT) * ALIGNMENT + ALIGNMENT)


def max_degree(indptr: np.ndarray, step: int = 1 << 20) -> int:
    """The longest list of a CSC's ``indptr`` (a memory map is fine), ``step`` nodes at a time: no 8 B/node
    temporary."""
    return max([0] + [int(np.diff(indptr[i:i + step + 1]).max()) for i in range(0, len(indptr) - 1, step)])


def _staging(size: int) -> mmap.mmap:
    """An anonymous mapping: page aligned (O_DIRECT needs it) and never touched until read into."""
    return mmap.mmap(-1, max(ALIGNMENT, -(-size // ALIGNMENT) * ALIGNMENT))


class NeighborReader:
    """Reads in-neighbour lists of ascending node sets from an ``indices`` file; see the module docstring.

    indptr: int64 [N+1], the CSC offsets (held, not copied when already int64 and contiguous);
    indices_path: the ``indices.npy`` file (or a raw array file when ``dtype`` and
    ``data_offset`` are both given); gap_bytes (default 4096): largest gap coalesced into one
    read, 0 for adjacent lists only; read_threads (default 8); direct_io (default False);
    block_bytes (default 1 MiB, rounded up to 4096): largest single read; staging_cap (default 8 MiB, rounded
    up to 4096): staged bytes per round of reads (``max_staging_bytes`` bounds the buffer); page_sums: the file's read
    checks, one XXH3-64 per 4 KiB page (``loader.format.read_checks``; None: unchecked). Checked reads are
    widened to whole pages and staged like O_DIRECT ones, every page is verified, and a mismatch raises
    ``CorruptData`` naming the page.
    """

    def __init__(self, indptr: np.ndarray, indices_path: Path | str, *, dtype: npt.DTypeLike | None = None,
                 data_offset: int | None = None, gap_bytes: int = DEFAULT_GAP_BYTES,
                 read_threads: int = DEFAULT_READ_THREADS, direct_io: bool = False,
                 block_bytes: int = DEFAULT_BLOCK_BYTES, staging_cap: int = DEFAULT_STAGING_CAP,
                 page_sums: np.ndarray | None = None) -> None:
        self.indptr = _check_indptr(indptr)
        self.page_sums = np.empty(0, np.uint64) if page_sums is None else np.ascontiguousarray(page_sums, np.uint64)
        self.path = Path(indices_path)
        if gap_bytes < 0:
            raise ValueError(f"gap_bytes: {gap_bytes}, expected >= 0")
        if read_threads < 1:
            raise ValueError(f"read_threads: {read_threads}, expected >= 1")
        if block_bytes < 1:
            raise ValueError(f"block_bytes: {block_bytes}, expected >= 1")
        if staging_cap < 1:
            raise ValueError(f"staging_cap: {staging_cap}, expected >= 1")
        if (dtype is None) != (data_offset is None):
            raise ValueError("dtype and data_offset: give both (a raw file) or neither (read the .npy header)")
        num_edges = int(self.indptr[-1])
        if dtype is None or data_offset is None:
            with NpyReader(self.path, expect_ndim=1) as header:
                self.dtype, self.data_offset = header.dtype, header.data_offset
                if header.nrows != num_edges:
                    raise ValueError(f"{self.path}: {header.nrows} entries, but indptr[-1] = {num_edges}")
        else:
            self.dtype, self.data_offset = np.dtype(dtype), int(data_offset)
            if self.data_offset < 0:
                raise ValueError(f"data_offset: {self.data_offset}, expected >= 0")
        if self.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise ValueError(f"{self.path}: index dtype {self.dtype}, expected int32 or int64 (little-endian)")
        self.gap_bytes = int(gap_bytes)
        self.read_threads = int(read_threads)
        self.block_bytes = -(-int(block_bytes) // ALIGNMENT) * ALIGNMENT
        self.staging_cap = -(-int(staging_cap) // ALIGNMENT) * ALIGNMENT
        self.max_staging_bytes = staging_bound(max_degree(self.indptr), self.dtype.itemsize,
                                               self.data_offset + num_edges * self.dtype.itemsize, self.staging_cap)
        """Most bytes the staging buffer maps (its pages are touched only as reads land in them)."""
        self.direct_io = bool(direct_io)
        self.read_calls = 0
        self.bytes_read = 0
        self.lists_read = 0
        self.list_bytes = 0
        self._lock = threading.Lock()
        self._staging_buffer = _staging(0)
        self._fd = self._open()
        try:
            self.file_size = os.fstat(self._fd).st_size
            if self.file_size < self.data_offset + num_edges * self.dtype.itemsize:
                raise UserError(f"{self.path}: truncated ({self.file_size} bytes, the lists need "
                                f"{self.data_offset + num_edges * self.dtype.itemsize}); run 'megabatch verify'")
            if self.direct_io:
                self._probe_direct()
        except BaseException:
            os.close(self._fd)
            raise
        self._pool = ThreadPoolExecutor(self.read_threads, thread_name_prefix="megabatch-nbr-read")

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    def _open(self) -> int:
        flags = os.O_RDONLY | os.O_CLOEXEC
        if self.direct_io:
            try:
                return os.open(self.path, flags | os.O_DIRECT)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise UserError(f"{self.path}: cannot open ({err.strerror})") from None
                self._give_up_direct("open")
        try:
            return os.open(self.path, flags)
        except OSError as err:
            raise UserError(f"{self.path}: cannot open ({err.strerror})") from None

    def _give_up_direct(self, where: str) -> None:
        log.warning("%s: the filesystem refuses O_DIRECT (EINVAL at %s); reading through the page cache",
                    self.path, where)
        self.direct_io = False

    def _probe_direct(self) -> None:
        """Some filesystems accept O_DIRECT at open and refuse the first read: find out now, not mid-pass."""
        try:
            os.preadv(self._fd, [memoryview(self._staging_buffer)[:ALIGNMENT]], 0)
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise UserError(f"{self.path}: cannot read ({err.strerror})") from None
            os.close(self._fd)
            self._fd = -1
            self._give_up_direct("the first read")
            self._fd = self._open()

    def _read_task(self, offsets: np.ndarray, lengths: np.ndarray, needs: np.ndarray, targets: np.ndarray,
                   dest_offsets: np.ndarray, views: tuple[memoryview, memoryview]) -> tuple[int, int]:
        """Run reads in sequence: ``lengths[i]`` bytes at file ``offsets[i]`` into ``views[targets[i]]``.

        At least ``needs[i]`` bytes must arrive (an aligned read may run past the end of file).
        Returns (preadv calls, bytes read).
        """
        calls = 0
        total = 0
        fd = self._fd
        for offset, length, need, target, dest in zip(offsets.tolist(), lengths.tolist(), needs.tolist(),
                                                      targets.tolist(), dest_offsets.tolist()):
            view = views[target]
            done = 0
            while done < need:
                try:
                    got = os.preadv(fd, [view[dest + done:dest + length]], offset + done)
                except OSError as err:
                    raise read_failed(self.path, length - done, offset + done, err) from err
                calls += 1
                if got == 0:
                    # the size was checked at open: a short read now means the file shrank under the reader
                    raise UserError(f"{self.path}: file ends early (wanted {need} bytes at byte {offset}; it shrank "
                                    f"after it was opened?); run 'megabatch verify'")
                done += got
            total += done
        return calls, total

    def read(self, nodes: npt.ArrayLike) -> NeighborLists:
        """The lists of ``nodes`` (strictly ascending ids in [0, N)), concatenated in that order."""
        ids = _sorted_node_ids("nodes", nodes, self.num_nodes)
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(self.indptr[ids + 1] - self.indptr[ids], out=offsets[1:])
        lists = np.empty(int(offsets[-1]), dtype=self.dtype)
        self._read_into(ids, offsets, lists)
        return NeighborLists(offsets, lists)

    def read_into(self, nodes: npt.ArrayLike, out: np.ndarray) -> None:
        """Write the lists of ``nodes`` (strictly ascending) concatenated into ``out``, which must fit exactly.

        ``out`` must be C-contiguous of the file's dtype (the neighbour cache reads into its
        own array this way, with no intermediate copy of the whole set).
        """
        ids = _sorted_node_ids("nodes", nodes, self.num_nodes)
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(self.indptr[ids + 1] - self.indptr[ids], out=offsets[1:])
        if out.dtype != self.dtype or out.ndim != 1 or not out.flags.c_contiguous or len(out) != offsets[-1]:
            raise ValueError(f"out: {out.dtype} {out.shape}, expected contiguous {self.dtype} ({int(offsets[-1])},)")
        self._read_into(ids, offsets, out)

    def _read_into(self, ids: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
        if self._fd < 0:
            raise ValueError(f"{self.path}: the reader is closed")
        itemsize = self.dtype.itemsize
        degrees = np.diff(offsets)
        nonempty = degrees > 0
        ids, degrees, out_entry = ids[nonempty], degrees[nonempty], offsets[:-1][nonempty]
        if len(ids) == 0:
            return
        list_begin = self.data_offset + self.indptr[ids] * itemsize
        list_end = list_begin + degrees * itemsize
        with self._lock:
            checked = len(self.page_sums) > 0
            direct = self.direct_io or checked
            if direct:
                read_begin = list_begin // ALIGNMENT * ALIGNMENT
                read_end = -(-list_end // ALIGNMENT) * ALIGNMENT
            else:
                read_begin, read_end = list_begin, list_end
            # Ascending ids give ascending, disjoint lists, so a range's end is its last member's end. A range
            # also ends where a window of staging_cap bytes of the file does, so that no range outgrows a round.
            starts_range = np.empty(len(ids), dtype=bool)
            starts_range[0] = True
            np.greater(read_begin[1:] - read_end[:-1], self.gap_bytes, out=starts_range[1:])
            window = read_begin // self.staging_cap
            starts_range[1:] |= window[1:] != window[:-1]
            first = np.flatnonzero(starts_range)
            last = np.append(first[1:], len(ids)) - 1
            range_begin, range_end = read_begin[first], read_end[last]
            # A buffered range holding no bytes but its lists maps onto the output as is: read it there.
            payload = np.add.reduceat(degrees, first) * itemsize
            straight = np.zeros(len(first), dtype=bool) if direct else payload == range_end - range_begin
            staged_len = np.where(straight, 0, range_end - range_begin)
            staged_end = np.cumsum(staged_len)
            staged_at = staged_end - staged_len
            out_bytes = out.view(np.uint8)
            r0 = 0
            while r0 < len(first):
                # a round: the ranges whose staged bytes fit the cap (at least one range, which fits it plus a list)
                base = int(staged_at[r0])
                r1 = max(r0 + 1, int(np.searchsorted(staged_end, base + self.staging_cap, side="right")))
                self._read_round(first, last, r0, r1, range_begin, range_end, straight, staged_at, base, list_begin,
                                 degrees, out_entry, out_bytes, checked)
                r0 = r1
            del out_bytes
            self.lists_read += len(ids)
            self.list_bytes += int(degrees.sum()) * itemsize

    def _read_round(self, first: np.ndarray, last: np.ndarray, r0: int, r1: int, range_begin: np.ndarray,
                    range_end: np.ndarray, straight: np.ndarray, staged_at: np.ndarray, base: int,
                    list_begin: np.ndarray, degrees: np.ndarray, out_entry: np.ndarray, out_bytes: np.ndarray,
                    checked: bool) -> None:
        """Ranges ``r0:r1`` read (staged ones at ``staged_at - base`` of the staging buffer), checked, and their
        lists copied out of the staging buffer into ``out_bytes``."""
        itemsize = self.dtype.itemsize
        begin, end, flat = range_begin[r0:r1], range_end[r0:r1], straight[r0:r1]
        at = staged_at[r0:r1] - base
        need = int(np.where(flat, 0, end - begin).sum())
        if need > len(self._staging_buffer):
            # doubling saves remaps; the bound holds the buffer to what the memory plans charge
            self._staging_buffer = _staging(max(need, min(self.max_staging_bytes, 2 * len(self._staging_buffer))))
        staging = np.frombuffer(self._staging_buffer, dtype=np.uint8)
        lo, hi = int(first[r0]), int(last[r1 - 1]) + 1  # the round's lists
        dest = np.where(flat, out_entry[first[r0:r1]] * itemsize, at)
        self._run_reads(begin, end, flat.astype(np.int64), dest, (staging.data, out_bytes.data))
        if checked:
            verify_blocks(self.page_sums, PAGE_BYTES, staging, np.where(flat, 0, at),
                          np.where(flat, 0, np.minimum(end, self.file_size) - begin), begin, self.path)
        range_of = np.repeat(np.arange(r1 - r0), last[r0:r1] - first[r0:r1] + 1)
        scattered = ~flat[range_of]
        if scattered.any():
            source = at[range_of] + list_begin[lo:hi] - begin[range_of]
            scatter_lists(staging, source[scattered], out_bytes, out_entry[lo:hi][scattered] * itemsize,
                          degrees[lo:hi][scattered] * itemsize)
        del staging

    def _run_reads(self, range_begin: np.ndarray, range_end: np.ndarray, target: np.ndarray, dest: np.ndarray,
                   views: tuple[memoryview, memoryview]) -> None:
        """Split ranges into blocks, deal them to the pool, wait for all, and count."""
        block = self.block_bytes
        pieces = (range_end - range_begin + block - 1) // block
        owner = np.repeat(np.arange(len(range_begin)), pieces)
        within = (np.arange(len(owner)) - np.repeat(np.cumsum(pieces) - pieces, pieces)) * block
        offsets = range_begin[owner] + within
        lengths = np.minimum(block, range_end[owner] - offsets)
        # O_DIRECT ranges may end past EOF (rounded up); only the file's bytes must arrive.
        needs = np.clip(np.minimum(lengths, self.file_size - offsets), 0, None)
        targets = target[owner]
        dests = dest[owner] + within
        tasks = min(self.read_threads, len(offsets))
        # Round-robin dealing spreads a long range's blocks over the threads.
        futures = [self._pool.submit(self._read_task, offsets[t::tasks], lengths[t::tasks], needs[t::tasks],
                                     targets[t::tasks], dests[t::tasks], views) for t in range(tasks)]
        failure: BaseException | None = None
        for future in futures:
            # Wait for every task even after a failure: a running read still writes into the buffers.
            try:
                calls, nbytes = future.result()
            except BaseException as err:
                failure = failure or err
                continue
            self.read_calls += calls
            self.bytes_read += nbytes
        if failure is not None:
            if isinstance(failure, OSError):
                raise UserError(f"{self.path}: read failed ({failure.strerror})") from failure
            raise failure

    @property
    def staging_bytes(self) -> int:
        """Bytes of the staging buffer now mapped (it grows to the largest read and stays, until released)."""
        return len(self._staging_buffer)

    def release_staging(self) -> None:
        """Unmap the staging buffer, which only grows: a one-off bulk read (the neighbour cache's fill
        reads 64 MiB steps) would otherwise stay resident, outside the memory plan, for the daemon's life."""
        with self._lock:
            self._staging_buffer = _staging(0)

    def close(self) -> None:
        """Stop the pool and close the file (idempotent)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "NeighborReader":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
