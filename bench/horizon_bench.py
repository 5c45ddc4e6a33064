"""How much a longer Belady horizon would save: feature-row misses per superbatch length, next to static.

The exact mode plans its feature cache per superbatch (``[fullgraph] superbatch`` batches, all sampled and
held in RAM until published), so the budget caps the horizon Belady sees. This bench takes the
first ``--batches`` training batches of epoch 0 on a prepared dataset (the same seeds, keys and
sampler as the daemon), then replays them through

* ``static``: the ``C`` rows of highest out-degree (what mode ``static`` holds), and
* Belady in the demand model (what mode ``exact`` plans), superbatch by superbatch with the cache
  state carried over, for each horizon in ``--horizons``,

and reports misses per row used and the ratio to static, with the sampled bytes one superbatch of
that length holds (``BYTES_PER_SAMPLED_NODE`` / ``_EDGE``, as the memory plan charges them). No I/O
is timed: this is a planning simulation over an in-RAM copy of the graph (run it on a machine
with the RAM for it), so no cgroup applies.

    .venv/bin/python bench/horizon_bench.py [--dataset /var/tmp/mbcompare/dataset] [--batches 256]
                                            [--cache-rows 86853] [--horizons 8,16,32,64,128,256]
"""

import argparse
import sys

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import first_training_batches, machine_description, write_results
from loader.caches.changeset import CachePlanner, CacheState
from loader.daemon.fullgraph.outofcore import BYTES_PER_SAMPLED_EDGE, BYTES_PER_SAMPLED_NODE, out_degree_ranking
from loader.format.dataset import open_dataset
from proto.errors import UserError
from proto.sizes import format_size


def belady_misses(node_ptr: np.ndarray, nodes: np.ndarray, num_nodes: int, capacity: int, horizon: int) -> int:
    """Misses of demand-model Belady planned ``horizon`` batches at a time, state carried across."""
    planner = CachePlanner(num_nodes, capacity)
    state, misses = CacheState(), 0
    batches = len(node_ptr) - 1
    for first in range(0, batches, horizon):
        last = min(batches, first + horizon)
        plan = planner.plan(node_ptr[first:last + 1] - node_ptr[first], nodes[node_ptr[first]:node_ptr[last]],
                            state, prefetch=False)
        misses += plan.num_misses
        state = CacheState(plan.final_ids, plan.final_slots)
    return misses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="/var/tmp/mbcompare/dataset")
    p.add_argument("--batches", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-rows", type=int, default=86_853, help="feature cache rows (default: what bench/compare's "
                   "exact daemon chose on its 448 MiB budget)")
    p.add_argument("--horizons", default="8,16,32,64,128,256")
    args = p.parse_args()
    horizons = [int(h) for h in args.horizons.split(",")]
    fanouts = [int(f) for f in args.fanouts.split(",")]
    try:
        dataset = open_dataset(args.dataset)
    except UserError as err:
        print(f"horizon_bench: {err} (bench/compare.py prepares the default dataset)", file=sys.stderr)
        return 2
    m = dataset.manifest
    sampled, count = first_training_batches(dataset, args.batches, args.batch_size, fanouts, args.seed)
    rows_used = len(sampled.nodes)
    static = np.zeros(m.num_nodes, dtype=bool)
    static[out_degree_ranking(dataset)[:args.cache_rows]] = True
    static_miss = 1.0 - float(static[sampled.nodes].mean())
    per_batch = (BYTES_PER_SAMPLED_NODE * rows_used + BYTES_PER_SAMPLED_EDGE * len(sampled.edge_src)) / count
    results = [{"policy": "static", "horizon": None, "miss_ratio": static_miss, "vs_static": 1.0,
                "superbatch_bytes": None}]
    for horizon in horizons:
        miss = belady_misses(sampled.node_ptr, sampled.nodes, m.num_nodes, args.cache_rows, horizon) / rows_used
        results.append({"policy": "belady", "horizon": horizon, "miss_ratio": miss, "vs_static": miss / static_miss,
                        "superbatch_bytes": per_batch * horizon})
        print(f"horizon {horizon}: {miss:.3f}", flush=True)
    lines = [f"machine: {machine_description()}; {m.num_nodes:,} nodes, {count} batches of {args.batch_size} seeds, "
             f"fanouts {fanouts}, cache {args.cache_rows:,} rows ({format_size(args.cache_rows * m.row_bytes)})", "",
             "| policy | horizon (batches) | misses / row used | vs static | one superbatch holds |",
             "|---|---|---|---|---|"]
    for r in results:
        held = "-" if r["superbatch_bytes"] is None else format_size(float(r["superbatch_bytes"]))  # type: ignore[arg-type]
        lines.append(f"| {r['policy']} | {r['horizon'] or '-'} | {float(r['miss_ratio']):.3f} | "  # type: ignore[arg-type]
                     f"{float(r['vs_static']):.3f} | {held} |")  # type: ignore[arg-type]
    text = "\n".join(lines)
    print(text)
    write_results("horizon", args, {"results": results}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
