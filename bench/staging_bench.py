"""Feature delivery of exact-mode batches three ways, side by side in one run: staged windows, row reads, RAM.

For the first ``--windows`` x ``--window`` training batches of epoch 0 on a prepared dataset (the
exact mode's seeds, keys and sampler; sampled up front, its time reported apart), every batch's
feature matrix (its nodes' rows in sampled order, what a slot receives) is produced by

* ``staged``: ``loader.staging`` (one sequential O_DIRECT pass over ``features.bin`` per window of
  ``--window`` batches, each batch's rows written to its region of a staging file under
  ``--staging-dir``, read back in one read at delivery), a stager thread staging window k + 1 while
  the consumer reads back window k;
* ``rows``: the exact mode's ``RowReader`` (O_DIRECT, its threads), every row of every batch read on its own, no cache
  (the exact mode's caches cut these reads by 10-30%: docs/PERFORMANCE.md);
* ``inmemory``: a gather from ``features.bin`` loaded whole into RAM (the in-memory loader's feature step).

All three read checks on (``staged`` also checks its staging regions). Reported per way: batches/s of
feature delivery, disk bytes read per delivered feature byte, and for ``staged`` the bytes written
and the file pass's read rate over the disk's sequential rate. The page cache is dropped first
(as root); every disk read is O_DIRECT, so RAM does not cache the dataset.

    .venv/bin/python bench/staging_bench.py [--dataset /var/tmp/mb-cmp/dataset] [--window 128] [--windows 2]
"""

import argparse
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import (
    drop_caches,
    first_training_batches,
    machine_description,
    sequential_rate,
    write_results,
)
from loader.caches.row_reader import RowReader
from loader.daemon.disk_graph import ROW_READ_THREADS
from loader.format.dataset import Dataset, open_dataset
from loader.format.partition_table import row_offsets_for
from loader.format.read_checks import load_read_checks
from loader.sampling.sampling import SampledPass, slice_pass
from loader.staging.stager import StagedWindow, WindowStager
from loader.staging.window_plan import batch_gather, plan_window
from proto.errors import UserError
from proto.sizes import format_size


def run_staged(dataset: Dataset, sampled: SampledPass, window: int, windows: int, staging_dir: Path,
               out: np.ndarray) -> dict[str, float]:
    m = dataset.manifest
    parts = dataset.partitions()
    checks = load_read_checks(dataset, blocks=True)
    ready: queue.Queue[StagedWindow | BaseException | None] = queue.Queue(maxsize=1)
    stage_seconds: list[float] = []
    stager = WindowStager(dataset.file("features"), row_bytes=m.row_bytes, staging_dir=staging_dir,
                          block_sums=None if checks is None else checks.feature_blocks,
                          check_block=m.feature_check_bytes)

    def produce() -> None:
        try:
            for w in range(windows):
                t0 = time.perf_counter()
                part = slice_pass(sampled, w * window, window)
                plan = plan_window(part.node_ptr, row_offsets_for(part.nodes, parts.node_begin, parts.feat_offset,
                                                                  m.row_bytes), m.row_bytes, stager.chunk_bytes)
                staged = stager.stage(plan)
                stage_seconds.append(time.perf_counter() - t0)
                ready.put(staged)
            ready.put(None)
        except BaseException as err:  # handed to the consumer, which raises it
            ready.put(err)

    read_back = np.zeros(1)
    file_bytes = staged_bytes = 0
    t0 = time.perf_counter()
    producer = threading.Thread(target=produce, name="stager")
    producer.start()
    try:
        read_seconds = 0.0
        w_done = 0
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            r0 = time.perf_counter()
            first = (w_done := w_done + 1) * window - window
            for b in range(item.plan.num_batches):
                nodes = sampled.nodes[sampled.node_ptr[first + b]:sampled.node_ptr[first + b + 1]]
                stager.read_batch(item, b, batch_gather(row_offsets_for(nodes, parts.node_begin, parts.feat_offset,
                                                                        m.row_bytes)), out)
            read_seconds += time.perf_counter() - r0
            file_bytes += item.stats.file_bytes_read
            staged_bytes += item.stats.staged_bytes
            item.close()
        read_back = np.array(read_seconds)
    finally:
        producer.join()
        stager.close()
    wall = time.perf_counter() - t0
    batches = window * windows
    return {"batches_per_s": batches / wall, "disk_read_bytes": file_bytes + staged_bytes,
            "written_bytes": staged_bytes, "file_pass_bytes": file_bytes,
            "stage_seconds_per_window": float(np.mean(stage_seconds)),
            "file_pass_mb_s": file_bytes / float(np.sum(stage_seconds)) / 1e6,
            "read_back_ms_per_batch": 1000 * float(read_back) / batches}


def run_rows(dataset: Dataset, sampled: SampledPass, batches: int, out: np.ndarray) -> dict[str, float]:
    m = dataset.manifest
    parts = dataset.partitions()
    checks = load_read_checks(dataset, blocks=True)
    with RowReader(dataset.file("features"), row_bytes=m.row_bytes, direct=True, threads=ROW_READ_THREADS,
                   block_sums=None if checks is None else checks.feature_blocks,
                   check_block=m.feature_check_bytes) as reader:
        t0 = time.perf_counter()
        for b in range(batches):
            nodes = sampled.nodes[sampled.node_ptr[b]:sampled.node_ptr[b + 1]]
            reader.read_rows(row_offsets_for(nodes, parts.node_begin, parts.feat_offset, m.row_bytes), out)
        wall = time.perf_counter() - t0
        return {"batches_per_s": batches / wall, "disk_read_bytes": reader.bytes_read}


def run_inmemory(dataset: Dataset, sampled: SampledPass, batches: int, out: np.ndarray) -> dict[str, float]:
    m = dataset.manifest
    parts = dataset.partitions()
    data = np.fromfile(dataset.file("features"), dtype=np.uint8)
    t0 = time.perf_counter()
    for b in range(batches):
        nodes = sampled.nodes[sampled.node_ptr[b]:sampled.node_ptr[b + 1]]
        rows = row_offsets_for(nodes, parts.node_begin, parts.feat_offset, m.row_bytes) // m.row_bytes
        np.take(data.reshape(-1, m.row_bytes), rows, axis=0, out=out[:len(nodes)])
    return {"batches_per_s": batches / (time.perf_counter() - t0), "disk_read_bytes": 0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="/var/tmp/mb-cmp/dataset")
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--staging-dir", default="/var/tmp")
    p.add_argument("--row-batches", type=int, default=64, help="batches of the row-read way (default 64)")
    args = p.parse_args()
    if args.window < 1 or args.windows < 1:
        p.error("--window and --windows: at least 1")
    try:
        dataset = open_dataset(args.dataset)
        m = dataset.manifest
        total = args.window * args.windows
        t0 = time.perf_counter()
        sampled, count = first_training_batches(dataset, total, args.batch_size,
                                                [int(f) for f in args.fanouts.split(",")], 0)
        sample_ms = 1000 * (time.perf_counter() - t0) / max(count, 1)
        if count < total:
            raise UserError(f"{args.dataset}: {count} training batches, fewer than the {total} asked for")
        out = np.empty((int(np.diff(sampled.node_ptr).max()), m.row_bytes), dtype=np.uint8)
        delivered = int(sampled.node_ptr[total]) * m.row_bytes
        seq = sequential_rate(Path(dataset.file("features")))
        results = {}
        drop_caches()
        results["staged"] = run_staged(dataset, sampled, args.window, args.windows, Path(args.staging_dir), out)
        results["staged"]["delivered_bytes"] = delivered
        drop_caches()
        row_batches = min(args.row_batches, total)
        results["rows"] = run_rows(dataset, sampled, row_batches, out)
        results["rows"]["delivered_bytes"] = int(sampled.node_ptr[row_batches]) * m.row_bytes
        results["inmemory"] = run_inmemory(dataset, sampled, total, out)
        results["inmemory"]["delivered_bytes"] = delivered
    except UserError as err:
        print(f"staging_bench: {err} (bench/compare.py prepares the default dataset)", file=sys.stderr)
        return 2
    staged = results["staged"]
    lines = [f"machine: {machine_description()}; {m.num_nodes:,} nodes, {m.row_bytes} B rows, features "
             f"{format_size(Path(dataset.file('features')).stat().st_size)}; {total} batches of {args.batch_size} "
             f"seeds, fanouts [{args.fanouts}] ({delivered / total / m.row_bytes:,.0f} rows each; sampled in RAM at "
             f"{sample_ms:.1f} ms/batch, not counted); sequential O_DIRECT read {seq:.0f} MB/s; staging in "
             f"{args.staging_dir}, windows of {args.window} batches", "",
             "| way | feature batches/s | vs rows | vs inmemory | disk read / delivered bytes |",
             "|---|---|---|---|---|"]
    rows_rate, ram_rate = results["rows"]["batches_per_s"], results["inmemory"]["batches_per_s"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['batches_per_s']:.1f} | {r['batches_per_s'] / rows_rate:.2f}x | "
                     f"{r['batches_per_s'] / ram_rate:.2f}x | {r['disk_read_bytes'] / r['delivered_bytes']:.2f}x |")
    lines.append(f"\nstaged: file pass {staged['file_pass_mb_s']:.0f} MB/s = {staged['file_pass_mb_s'] / seq:.2f}x "
                 f"sequential, {staged['stage_seconds_per_window']:.2f} s per window; written "
                 f"{format_size(staged['written_bytes'])} ({staged['written_bytes'] / staged['delivered_bytes']:.2f}x "
                 f"delivered); read-back {staged['read_back_ms_per_batch']:.1f} ms per batch")
    text = "\n".join(lines)
    print(text)
    write_results("staging", args, {"sequential_mb_s": seq, "results": results}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
