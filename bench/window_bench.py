"""How dense an exact-mode window's feature reads get as the window grows: block reads vs row reads.

The exact mode reads every missed row on its own (4 KiB pages, many in flight). AGNES (arXiv
2601.01473) instead reads whole 1 MiB blocks of the feature file once per "hyperbatch" of ~1000
mini-batches and scatters the rows to every batch that needs them. Whether that pays depends on how
many of a block's rows a window of batches needs. This bench measures it on a prepared dataset,
without I/O: it takes the first ``--batches`` training batches of epoch 0 (the exact mode's seeds,
keys and sampler), and for windows of H consecutive batches (``--windows``) computes

* the distinct rows the window needs that a static cache of ``--cache-rows`` rows of highest
  out-degree does not hold (what must come from disk once per window, every row read once however
  many batches of the window want it; a Belady cache would keep some of them across windows, so this
  is an upper bound on what must be read);
* their 4 KiB pages and aligned ``--block``-byte blocks of ``features.bin`` (partition-contiguous);
* three read plans: ``pages`` (every needed page on its own, today's row path), ``blocks`` (every
  touched block whole: AGNES), ``mixed`` (a block whole where that is faster than its pages at the
  measured rates, else its pages: the cost model AGNES lacks);

and reports, per plan, the bytes read over the bytes of the rows used (distinct rows of the window,
and every row every batch of the window delivers), and the read time per batch at ``--seq-mb-s``
sequential and ``--random-iops`` random 4 KiB reads (defaults: this machine's, from the developers'
guide), hence the batches/s the reads alone allow. The rows must then be held (RAM or per-batch
staging on SSD) from their read until their batch is published: "held" is the distinct rows of one
window, what a window costs.

    .venv/bin/python bench/window_bench.py [--dataset /var/tmp/mb-cmp/dataset] [--batches 1024]
                                           [--batch-size 256] [--windows 8,32,128,512,1024]
"""

import argparse
import sys

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import first_training_batches, machine_description, write_results
from loader.daemon.fullgraph.outofcore import out_degree_ranking
from loader.format.dataset import open_dataset
from loader.format.partition_table import row_offsets_for
from proto.errors import UserError
from proto.sizes import format_size, parse_size

PAGE = 4096


def read_plans(offsets: np.ndarray, row_bytes: int, block: int, seq_bytes_s: float, iops: float
               ) -> dict[str, tuple[float, float]]:
    """(bytes read, seconds) of each plan for the rows at byte ``offsets`` (distinct)."""
    first_page = offsets // PAGE
    count = (offsets + row_bytes - 1) // PAGE - first_page + 1  # pages each row spans
    within = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    pages = np.unique(np.repeat(first_page, count) + within)
    per_block = PAGE * np.bincount(pages * PAGE // block)
    touched = np.flatnonzero(per_block)
    page_bytes = per_block[touched].astype(np.float64)  # bytes of needed pages per touched block
    page_time = page_bytes / PAGE / iops
    block_time = np.full(len(touched), block / seq_bytes_s)
    whole = block_time <= page_time
    return {
        "pages": (float(page_bytes.sum()), float(page_time.sum())),
        "blocks": (float(len(touched) * block), float(block_time.sum())),
        "mixed": (float(np.where(whole, block, page_bytes).sum()),
                  float(np.where(whole, block_time, page_time).sum())),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="/var/tmp/mb-cmp/dataset")
    p.add_argument("--batches", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-rows", type=int, default=0, help="static cache rows left out of the reads (default 0)")
    p.add_argument("--windows", default="8,32,128,512,1024")
    p.add_argument("--block", default="1M", help="block size of the block plans (default 1M, AGNES)")
    p.add_argument("--seq-mb-s", type=float, default=690.0, help="sequential read rate, MB/s (default 690)")
    p.add_argument("--random-iops", type=float, default=30_000.0,
                   help="random 4 KiB reads/s with many in flight (default 30000)")
    args = p.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    fanouts = [int(f) for f in args.fanouts.split(",")]
    block = parse_size(args.block)
    if block % PAGE:
        p.error(f"--block must be a multiple of {PAGE}")
    try:
        dataset = open_dataset(args.dataset)
    except UserError as err:
        print(f"window_bench: {err} (bench/compare.py prepares the default dataset)", file=sys.stderr)
        return 2
    m = dataset.manifest
    parts = dataset.partitions()
    sampled, count = first_training_batches(dataset, args.batches, args.batch_size, fanouts, args.seed)
    rows_per_batch = len(sampled.nodes) / count
    cached = np.zeros(m.num_nodes, dtype=bool)
    if args.cache_rows:
        cached[out_degree_ranking(dataset)[:args.cache_rows]] = True
    seq = args.seq_mb_s * 1e6
    results = []
    for window in windows:
        if window > count:
            continue
        totals: dict[str, list[float]] = {"pages": [0.0, 0.0], "blocks": [0.0, 0.0], "mixed": [0.0, 0.0]}
        distinct = delivered = 0
        held = 0
        windows_done = count // window
        for w in range(windows_done):
            lo, hi = sampled.node_ptr[w * window], sampled.node_ptr[(w + 1) * window]
            rows = np.unique(sampled.nodes[lo:hi])
            rows = rows[~cached[rows]]
            distinct += len(rows)
            delivered += int(hi - lo)
            held = max(held, len(rows))
            offsets = row_offsets_for(rows, parts.node_begin, parts.feat_offset, m.row_bytes)
            for name, (nbytes, seconds) in read_plans(offsets, m.row_bytes, block, seq, args.random_iops).items():
                totals[name][0] += nbytes
                totals[name][1] += seconds
        batches = windows_done * window
        for name, (nbytes, seconds) in totals.items():
            results.append({
                "window": window, "plan": name, "distinct_rows_per_batch": distinct / batches,
                "read_over_distinct": nbytes / (distinct * m.row_bytes),
                "read_over_delivered": nbytes / (delivered * m.row_bytes),
                "read_seconds_per_batch": seconds / batches,
                "batches_per_s_bound": batches / seconds if seconds else None,
                "disk_busy_vs_seq": (nbytes / seconds) / seq if seconds else None,
                "held_bytes": held * m.row_bytes})
        print(f"window {window}: " + ", ".join(f"{r['plan']} {r['read_over_delivered']:.2f}x delivered, "
                                               f"{r['batches_per_s_bound']:.1f} b/s" for r in results[-3:]), flush=True)
    lines = [f"machine: {machine_description()}; {m.num_nodes:,} nodes, {m.row_bytes} B rows, features "
             f"{format_size(int(parts.feat_nbytes.sum()))}; {count} batches of {args.batch_size} seeds, fanouts "
             f"{fanouts} ({rows_per_batch:,.0f} rows delivered per batch); static cache {args.cache_rows:,} rows; "
             f"block {format_size(block)}; rates {args.seq_mb_s:g} MB/s sequential, {args.random_iops:,.0f} random "
             "4 KiB reads/s", "",
             "| window (batches) | plan | distinct rows / batch | read / distinct bytes | read / delivered bytes | "
             "read s / batch | batches/s (reads alone) | disk rate / sequential | window holds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['window']} | {r['plan']} | {r['distinct_rows_per_batch']:,.0f} | "
                     f"{r['read_over_distinct']:.2f}x | {r['read_over_delivered']:.2f}x | "
                     f"{r['read_seconds_per_batch']:.3f} | {r['batches_per_s_bound']:.1f} | "
                     f"{r['disk_busy_vs_seq']:.2f} | {format_size(int(r['held_bytes']))} |")
    text = "\n".join(lines)
    print(text)
    write_results("window", args, {"results": results}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
