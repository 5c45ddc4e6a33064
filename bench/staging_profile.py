"""Where one staging pass spends its time: cProfile of ``WindowStager.stage`` on one window, alone (no daemon).

Samples the first 2 x ``--window`` training batches of epoch 0 (the exact mode's seeds and keys), plans the
second window with the ``--cache-rows`` rows of highest out-degree held out (as mode staged's feature cache
does), stages the first window once to compile the kernels, drops the page cache (as root) and profiles
staging the second: plan milliseconds per batch, pass milliseconds per batch, bytes read and written, and
the functions that took the time (lock waits are the disk: chunk reads ahead and O_DIRECT writes).

    .venv/bin/python bench/staging_profile.py [--dataset /var/tmp/mb-cmp1m/dataset] [--window 128]
        [--chunk 16M] [--cache-rows 171557] [--staging-dir /var/tmp]
"""

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import drop_caches, first_training_batches, machine_description
from loader.daemon.fullgraph.outofcore import out_degree_ranking
from loader.format.dataset import open_dataset
from loader.format.partition_table import row_offsets_for
from loader.format.read_checks import load_read_checks
from loader.sampling.sampling import SampledPass, slice_pass
from loader.staging.stager import WindowStager
from loader.staging.window_plan import WindowPlan, plan_window
from proto.errors import UserError
from proto.sizes import parse_size


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="/var/tmp/mb-cmp1m/dataset")
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--chunk", default="16M")
    p.add_argument("--cache-rows", type=int, default=0)
    p.add_argument("--staging-dir", default="/var/tmp")
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args()
    try:
        ds = open_dataset(args.dataset)
        chunk = parse_size(args.chunk)
    except (UserError, ValueError) as err:
        print(f"staging_profile: {err}", file=sys.stderr)
        return 2
    m, parts = ds.manifest, ds.partitions()
    sampled, _ = first_training_batches(ds, 2 * args.window, args.batch_size, [10, 5], 0)
    cached = np.zeros(m.num_nodes, dtype=bool)
    cached[out_degree_ranking(ds)[:args.cache_rows]] = True
    checks = load_read_checks(ds, blocks=True)
    stager = WindowStager(ds.file("features"), row_bytes=m.row_bytes, staging_dir=Path(args.staging_dir),
                          block_sums=checks.feature_blocks if checks else None, check_block=m.feature_check_bytes,
                          direct=True, chunk_bytes=chunk, scatter_bytes=chunk)

    def plan_of(part: SampledPass) -> tuple[WindowPlan, float]:
        offsets = row_offsets_for(part.nodes, parts.node_begin, parts.feat_offset, m.row_bytes)
        offsets[cached[part.nodes]] = -1
        t0 = time.perf_counter()
        plan = plan_window(part.node_ptr, offsets, m.row_bytes, chunk, sequential_rate=690e6, random_reads=30e3)
        return plan, time.perf_counter() - t0

    with stager:
        stager.stage(plan_of(slice_pass(sampled, 0, args.window))[0]).close()  # compiles the kernels
        plan, plan_seconds = plan_of(slice_pass(sampled, args.window, args.window))
        drop_caches()
        profile = cProfile.Profile()
        t0 = time.perf_counter()
        profile.enable()
        staged = stager.stage(plan)
        profile.disable()
        seconds = time.perf_counter() - t0
        stats = staged.stats
        staged.close()
    print(machine_description())
    print(f"window of {args.window} batches, chunks of {args.chunk}, {args.cache_rows:,} rows held out: plan "
          f"{1000 * plan_seconds / args.window:.2f} ms/batch; pass {seconds:.2f} s = "
          f"{1000 * seconds / args.window:.1f} ms/batch; read {stats.file_bytes_read / 2**20:,.0f} MiB in "
          f"{stats.chunks} chunks, staged {stats.staged_bytes / 2**20:,.0f} MiB in {stats.writes:,} writes "
          f"({(stats.file_bytes_read + stats.staged_bytes) / seconds / 1e6:,.0f} MB/s both ways)")
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main())
