"""Would the hybrid mode (issue 15) pay? Rows a window's batches find in RAM: resident partitions against rows.

The hybrid mode of issue 15 keeps the exact mode's batches (a uniformly random schedule, bitwise the
in-memory sampler's) and gives the RAM the budget leaves for features to a mega-batch of whole partitions,
loaded sequentially per superbatch (the hierarchical reader), reading the rest of each batch's rows at
random. This bench measures its premise without building it: over the first ``--windows`` superbatches of
``--window`` batches of epoch 0 (the exact mode's seeds, keys and sampler, over an in-RAM copy of the graph),
for each RAM share of the feature file in ``--shares``, the share of row accesses (a row of a batch) served
from RAM by

* ``rows by degree``: the rows of highest out-degree (mode ``static``'s and mode ``staged``'s cache);
* ``Belady``: the demand-model Belady plan over each superbatch (mode ``exact``'s cache);
* ``best partitions``: per superbatch, the partitions with the most of its accesses per byte, as many as
  the share holds (the hybrid's mega-batch at its best: an oracle that knows the superbatch);
* ``first partitions``: the first superbatch's best partitions kept for all (a mega-batch never rotated),

with the partition bytes the best choice loads per superbatch that the previous one did not hold, and the
random reads per batch the best partitions leave (one per row missed: the hybrid's row path). No I/O is
timed: a planning simulation, so no cgroup applies.

    .venv/bin/python bench/hybrid_bench.py [--dataset /var/tmp/mb-cmp1m/dataset] [--window 128] [--windows 4]
        [--shares 0.1,0.2,0.35,0.5] [--batch-size 256] [--fanouts 10,5]
"""

import argparse
import sys

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import first_training_batches, machine_description, write_results
from bench.horizon_bench import belady_misses
from loader.daemon.fullgraph.outofcore import out_degree_ranking
from loader.format.dataset import open_dataset
from proto.errors import UserError


def best_partitions(accesses: np.ndarray, nbytes: np.ndarray, capacity: int) -> np.ndarray:
    """Partitions by accesses per byte, taken while they fit in ``capacity`` bytes: a bool mask."""
    order = np.argsort(-accesses / np.maximum(nbytes, 1), kind="stable")
    fits = np.cumsum(nbytes[order]) <= capacity
    chosen = np.zeros(len(nbytes), dtype=bool)
    chosen[order[fits]] = True
    return chosen


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="/var/tmp/mb-cmp1m/dataset")
    p.add_argument("--window", type=int, default=128, help="batches per superbatch (default 128)")
    p.add_argument("--windows", type=int, default=4, help="superbatches simulated (default 4)")
    p.add_argument("--shares", default="0.1,0.2,0.35,0.5", help="RAM for features, as shares of features.bin")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    try:
        shares = [float(s) for s in args.shares.split(",")]
        fanouts = [int(f) for f in args.fanouts.split(",")]
        if args.window < 1 or args.windows < 1 or not all(0 < s < 1 for s in shares):
            raise UserError("--window and --windows must be positive, and --shares between 0 and 1")
        dataset = open_dataset(args.dataset)
    except (UserError, ValueError) as err:
        print(f"hybrid_bench: {err}", file=sys.stderr)
        return 2
    m = dataset.manifest
    parts = dataset.partitions()
    part_bytes = parts.feat_nbytes.astype(np.int64)
    file_bytes = int(part_bytes.sum())
    sampled, count = first_training_batches(dataset, args.window * args.windows, args.batch_size, fanouts, args.seed)
    windows = [(w, min(count, w + args.window)) for w in range(0, count, args.window)]
    part_of = parts.partition_of(sampled.nodes)
    accesses = [np.bincount(part_of[sampled.node_ptr[a]:sampled.node_ptr[b]], minlength=len(parts)) for a, b in windows]
    total = len(sampled.nodes)
    ranking = out_degree_ranking(dataset)
    results = []
    for share in shares:
        capacity = int(share * file_bytes)
        rows = capacity // m.row_bytes
        by_degree = np.zeros(m.num_nodes, dtype=bool)
        by_degree[ranking[:rows]] = True
        belady_hits = total - belady_misses(sampled.node_ptr, sampled.nodes, m.num_nodes, rows, args.window)
        chosen = [best_partitions(a, part_bytes, capacity) for a in accesses]
        best = sum(int(a[c].sum()) for a, c in zip(accesses, chosen))
        first = sum(int(a[chosen[0]].sum()) for a in accesses)
        reloaded = [int(part_bytes[c & ~before].sum()) for before, c in zip(chosen, chosen[1:])]
        results.append({
            "share": share, "ram_bytes": capacity, "rows_by_degree": float(by_degree[sampled.nodes].mean()),
            "belady": belady_hits / total, "best_partitions": best / total, "first_partitions": first / total,
            "reloaded_share": float(np.mean(reloaded)) / max(1, capacity) if reloaded else None,
            "hybrid_random_reads_per_batch": (total - best) / count})
        print(f"share {share}: done", flush=True)
    lines = [f"machine: {machine_description()}; {m.num_nodes:,} nodes in {len(parts)} partitions, "
             f"{count} batches of {args.batch_size} seeds ({total / count:,.0f} rows each), fanouts {fanouts}, "
             f"superbatches of {args.window}", "",
             "| RAM for features (share of the file) | rows by degree (static, staged) | Belady per superbatch (exact) "
             "| best partitions per superbatch (hybrid) | first superbatch's partitions kept "
             "| partition bytes reloaded per superbatch | hybrid's random reads per batch |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        moved = "-" if r["reloaded_share"] is None else f"{r['reloaded_share']:.0%} of them"
        lines.append(f"| {r['share']:.0%} | {r['rows_by_degree']:.3f} | {r['belady']:.3f} | {r['best_partitions']:.3f} "
                     f"| {r['first_partitions']:.3f} | {moved} | {r['hybrid_random_reads_per_batch']:,.0f} |")
    text = "\n".join(lines)
    print(text)
    write_results("hybrid", args, {"results": results}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
