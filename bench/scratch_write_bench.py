"""O_DIRECT staging writes into a new (sparse), a fallocated and an already written scratch file, side by side.

Why ``loader.staging.scratch_files.ScratchFiles`` keeps staging files for later windows: the stager writes
each batch's run of a chunk (about 100 KiB) to that batch's region, so a window's writes are ``--regions``
interleaved sequential streams, ``--threads`` writes in flight. On ext4 a direct write into a hole (or an
unwritten, fallocated extent) also allocates or converts its extent; rewriting written blocks does not.
Prints MB/s per kind of file, the ratio to the sparse one, and how long closing the file took (freeing its
extents, on the thread that closes it).

    .venv/bin/python bench/scratch_write_bench.py [--dir /var/tmp] [--size 1G] [--write 100K] [--threads 8]
"""

import argparse
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import machine_description
from proto.errors import UserError
from proto.sizes import parse_size

KINDS = ("sparse", "fallocated", "written")


def scratch_file(directory: Path, size: int, kind: str) -> int:
    fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    if kind == "fallocated":
        os.posix_fallocate(fd, 0, size)
        return fd
    os.ftruncate(fd, size)
    if kind == "written":
        block = mmap.mmap(-1, 8 << 20)
        for at in range(0, size, len(block)):
            os.pwrite(fd, block[:min(len(block), size - at)], at)
        os.fsync(fd)
    return fd


def run(directory: Path, size: int, write: int, regions: int, threads: int, kind: str) -> tuple[float, float]:
    """(MB/s of the interleaved direct writes, seconds to close the file)."""
    fd = scratch_file(directory, size, kind)
    direct = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    data = mmap.mmap(-1, write)  # page aligned, as O_DIRECT wants
    per = size // regions // write * write
    offsets = [r * per + k * write for k in range(per // write) for r in range(regions)]
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(lambda at: os.pwrite(direct, data, at), offsets):
            pass
    rate = len(offsets) * write / (time.perf_counter() - started) / 1e6
    started = time.perf_counter()
    os.close(direct)
    os.close(fd)
    return rate, time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/var/tmp", help="where the unnamed scratch files go (default /var/tmp)")
    p.add_argument("--size", default="1G", help="bytes per file (default 1G)")
    p.add_argument("--write", default="100K", help="bytes per write, a multiple of 4 KiB (default 100K)")
    p.add_argument("--regions", type=int, default=128, help="interleaved streams (a window's batches; default 128)")
    p.add_argument("--threads", type=int, default=8, help="writes in flight (the stager's WRITE_THREADS; default 8)")
    args = p.parse_args()
    try:
        size, write = parse_size(args.size), parse_size(args.write) // 4096 * 4096
        if write <= 0 or size < write * args.regions or args.regions < 1 or args.threads < 1:
            raise UserError("--write must be at least 4K, and --size at least --regions writes")
        directory = Path(args.dir)
        if not directory.is_dir():
            raise UserError(f"--dir: {directory} is not a directory")
        print(machine_description())
        print(f"{args.regions} interleaved streams of {write // 1024} KiB O_DIRECT writes, {args.threads} in flight, "
              f"{size >> 20} MiB files under {directory}")
        results = {}
        for kind in KINDS:
            results[kind] = run(directory, size, write, args.regions, args.threads, kind)
        for kind, (rate, close) in results.items():
            print(f"  {kind:10s} {rate:7.0f} MB/s  {rate / results['sparse'][0]:4.2f}x sparse  "
                  f"close {close * 1000:6.0f} ms")
    except (UserError, OSError) as err:
        print(f"scratch_write_bench: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
