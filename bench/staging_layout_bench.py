"""Mode staged's disk traffic under two staging-file layouts, side by side: per-batch regions against a log.

A profile of the staged daemon (docs/PERFORMANCE.md) found its 8 writer threads in ``pwrite`` 85% of the
time and the staging pass waiting on them 64% of it: each batch's run of a chunk (about 110 KiB on
bench/compare's 1M-node graph) goes to that batch's own region, so a window's writes are hundreds of
interleaved streams of small writes, while a batch is read back in one sequential read. A log layout
turns that around: each chunk's runs are written together, one large sequential write at the end of the
file, and a batch is read back as one extent per chunk (tens of reads of ~110 KiB, many in flight).

This bench times one window of each layout with all three of the staged mode's streams at once, the
bytes per batch those of the 1M-node run: the pass (``--pass`` bytes of a file read in 16 MiB O_DIRECT
chunks), the staging writes (``--staged`` bytes per batch, in runs of that over ``--chunks``), and the
read-back of the previous window's batches (the same bytes, from a second file). Both staging files are
written once first, as the pool of ``ScratchFiles`` keeps them. Layouts alternate for ``--rounds`` rounds
so that drift in this virtual disk's rate falls on both; it prints ms per batch and the ratio.

    .venv/bin/python bench/staging_layout_bench.py [--dir /var/tmp] [--batches 256] [--staged 6.4M]
        [--pass-bytes 977M] [--chunks 61] [--rounds 2]
"""

import argparse
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import drop_caches, machine_description
from proto.errors import UserError
from proto.sizes import format_size, parse_size

PAGE = 4096
CHUNK = 16 << 20
LOG_WRITE = 4 << 20
"""Bytes per write of the log layout (a scatter buffer's worth goes out as a few of these)."""
IN_FLIGHT = 8
"""Writes in flight (the stager's WRITE_THREADS) and, in the log layout, read-back reads in flight."""


def pages(n: int) -> int:
    return -(-n // PAGE) * PAGE


def scratch(directory: Path, size: int) -> int:
    """An unnamed O_DIRECT file of ``size`` bytes, written once (as a kept staging file is)."""
    fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC, 0o600)
    block = mmap.mmap(-1, 8 << 20)
    for at in range(0, size, len(block)):
        os.pwrite(fd, memoryview(block)[:min(len(block), size - at)], at)
    os.fsync(fd)
    return fd


def window(layout: str, write_fd: int, read_fd: int, pass_fd: int, pass_bytes: int, batches: int, run: int,
           chunks: int) -> float:
    """Seconds for one window: the pass and the writes of this window, the read-back of the last one's batches
    (each stream on its own threads, as in the daemon: the pass's read ahead, the writers, the publisher's)."""
    write_buf = mmap.mmap(-1, max(LOG_WRITE, run))
    chunk_bufs = [mmap.mmap(-1, CHUNK), mmap.mmap(-1, CHUNK)]
    back = mmap.mmap(-1, pages(run * chunks) + PAGE)
    pass_chunks = pass_bytes // CHUNK

    def staging(reader: ThreadPoolExecutor, writers: ThreadPoolExecutor) -> None:
        ahead = reader.submit(os.preadv, pass_fd, [chunk_bufs[0]], 0) if pass_chunks else None
        for c in range(chunks):
            if ahead is not None:  # this chunk's read lands; the next one's starts while its rows are written
                ahead.result()
                ahead = reader.submit(os.preadv, pass_fd, [chunk_bufs[(c + 1) % 2]], (c + 1) * CHUNK) \
                    if c + 1 < min(chunks, pass_chunks) else None
            if layout == "regions":  # one write per batch, at the end of its region
                futures = [writers.submit(os.pwrite, write_fd, memoryview(write_buf)[:run],
                                          b * chunks * run + c * run) for b in range(batches)]
            else:  # the chunk's runs of every batch, appended in large writes
                total, base = batches * run, c * batches * run
                futures = [writers.submit(os.pwrite, write_fd, memoryview(write_buf)[:min(LOG_WRITE, total - at)],
                                          base + at) for at in range(0, total, LOG_WRITE)]
            wait(futures)

    def read_back(readers: ThreadPoolExecutor) -> None:
        for b in range(batches):
            if layout == "regions":  # the batch's region, sequentially, 4 MiB at a time
                region = run * chunks
                for at in range(0, region, LOG_WRITE):
                    os.preadv(read_fd, [memoryview(back)[:min(LOG_WRITE, region - at)]], b * chunks * run + at)
            else:  # one extent per chunk, scattered over the log, IN_FLIGHT at once
                wait([readers.submit(os.preadv, read_fd, [memoryview(back)[c * run:(c + 1) * run]],
                                     c * batches * run + b * run) for c in range(chunks)])

    started = time.perf_counter()
    with ThreadPoolExecutor(1) as reader, ThreadPoolExecutor(IN_FLIGHT) as writers, \
            ThreadPoolExecutor(IN_FLIGHT) as readers, ThreadPoolExecutor(2) as streams:
        for future in [streams.submit(staging, reader, writers), streams.submit(read_back, readers)]:
            future.result()
    return time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/var/tmp", help="where the scratch files go (default /var/tmp)")
    p.add_argument("--batches", type=int, default=256, help="batches per window (default 256)")
    p.add_argument("--staged", default="6.4M", help="staged bytes per batch (default 6.4M)")
    p.add_argument("--pass-bytes", default="977M", help="bytes the pass reads per window (default 977M)")
    p.add_argument("--chunks", type=int, default=61, help="chunks a batch's rows lie in (default 61)")
    p.add_argument("--rounds", type=int, default=2, help="windows per layout, alternating (default 2)")
    args = p.parse_args()
    try:
        staged, pass_bytes = parse_size(args.staged), parse_size(args.pass_bytes)
        if args.batches < 1 or args.chunks < 1 or args.rounds < 1 or staged < args.chunks * PAGE:
            raise UserError("--batches, --chunks and --rounds must be positive, --staged at least a page per chunk")
    except (UserError, ValueError) as err:
        print(f"staging_layout_bench: {err}", file=sys.stderr)
        return 2
    run = pages(staged // args.chunks)
    size = args.batches * args.chunks * run
    directory = Path(args.dir)
    print(f"writing three scratch files ({format_size(size)}, {format_size(size)}, "
          f"{format_size(pass_bytes)}) under {directory}", flush=True)
    fds = [scratch(directory, size), scratch(directory, size), scratch(directory, max(pass_bytes, CHUNK))]
    times: dict[str, list[float]] = {"regions": [], "log": []}
    try:
        for r in range(args.rounds):
            for layout in ("regions", "log"):
                drop_caches()
                a, b = (fds[0], fds[1]) if r % 2 == 0 else (fds[1], fds[0])
                seconds = window(layout, a, b, fds[2], pass_bytes, args.batches, run, args.chunks)
                times[layout].append(seconds)
                print(f"round {r + 1} {layout:8s} {seconds * 1000 / args.batches:6.1f} ms per batch", flush=True)
    finally:
        for fd in fds:
            os.close(fd)
    moved = (2 * args.batches * run * args.chunks + pass_bytes) / 1e6
    print(f"\nmachine: {machine_description()}")
    print(f"window of {args.batches} batches: runs of {format_size(run)} in {args.chunks} chunks "
          f"({format_size(run * args.chunks)} staged per batch), pass {format_size(pass_bytes)}; "
          f"{IN_FLIGHT} writes in flight")
    for layout, ts in times.items():
        best = min(ts)
        print(f"  {layout:8s} {best * 1000 / args.batches:6.1f} ms per batch (best of {len(ts)}), "
              f"{moved / best:6.0f} MB/s moved, {min(times['regions']) / best:4.2f}x regions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
