"""Bytes shipped per training batch with and without a trainer-side feature cache (``--feature-cache``).

One run: generate + prepare a graph (or reuse ``--work``), start ``megabatch serve`` in the given mode,
then consume epochs 0 .. ``--epochs``-1 (counting the first ``--batches`` of each) twice, each in its
own session: once without a cache and once with a cache of ``--cache`` bytes (the cache lives as long
as the session, so later epochs show its steady state). The consumer assembles every batch on the
CPU (``trainer.device_cache``) and checks it against the cache-less run bitwise. Reported: bytes of
x shipped per batch (mean), rows shipped per batch, and with/without ratios, per epoch and overall.
No timing: the figure is what crosses the slot (and PCIe on a GPU), which the cache exists to cut.

    .venv/bin/python bench/trainer_cache_bench.py [--nodes 200000] [--feat-dim 128] [--mode hierarchical]
                                                  [--cache 64M] [--batches 200] [--epochs 1] [--work DIR]
"""

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import RESULTS, generated_dataset, wait_for_socket
from proto.sizes import format_size, parse_size
from trainer.daemon_source import DaemonSource
from trainer.device_cache import DeviceFeatureCache

PY = sys.executable



def consume(sock: Path, cache_bytes: int, epochs: int, batches: int
            ) -> tuple[int, list[list[tuple[int, int, bytes]]]]:
    """(accepted cache rows, per epoch per batch: (rows, shipped rows, a digest of the assembled x))."""
    source = DaemonSource(str(sock), timeout=None, feature_cache_bytes=cache_bytes)
    info = source.info
    rows = info.feature_cache_rows
    cache = (DeviceFeatureCache(rows, info.num_features, getattr(torch, info.feature_dtype), torch.device("cpu"))
             if rows else None)
    out: list[list[tuple[int, int, bytes]]] = []
    try:
        for epoch in range(epochs):
            seen: list[tuple[int, int, bytes]] = []
            for batch in source.train_batches(epoch):
                shipped = batch.x.shape[0]
                if cache is not None:
                    batch = cache.assemble_batch(batch)  # past --batches too: the cache must stay in step
                if len(seen) < batches:
                    seen.append((batch.x.shape[0], shipped, hashlib.blake2b(batch.x.numpy().tobytes()).digest()))
                batch.release()
            out.append(seen)
    finally:
        source.close()
    return rows, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--avg-degree", type=float, default=15)
    p.add_argument("--feat-dim", type=int, default=128)
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--mode", default="hierarchical", help="[loader] mode (default hierarchical)")
    p.add_argument("--budget", default="1G")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--cache", default="64M", help="trainer feature cache size (default 64M)")
    p.add_argument("--batches", type=int, default=0, help="batches per epoch to consume (default 0: all)")
    p.add_argument("--epochs", type=int, default=1, help="epochs per session (default 1)")
    p.add_argument("--work", default=None, help="keep the generated data here (reused when present)")
    args = p.parse_args()
    cache_bytes = parse_size(args.cache)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mb-trainer-cache-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    dataset = generated_dataset(work, args.nodes, args.avg_degree, args.feat_dim, args.partitions,
                                generate_budget=None, prepare_budget="2G")
    sock = work / "bench.sock"
    sock.unlink(missing_ok=True)
    config = work / "trainer-cache.toml"
    config.write_text(f"""[dataset]\npath = "{dataset}"\n[memory]\nbudget = "{args.budget}"\n[loader]
mode = "{args.mode}"\n[hierarchy]\npasses = 1\n[sampler]\nbatch_size = {args.batch_size}\nfanouts = {fanouts}
[server]\nsocket = "{sock}"\nmax_clients = 2\n[metrics]\nport = 0\n""")
    daemon = subprocess.Popen([PY, "-m", "loader.cli", "serve", "--config", str(config)])
    try:
        wait_for_socket(sock, daemon)
        _, plain = consume(sock, 0, args.epochs, args.batches or 2**62)
        rows, cached = consume(sock, cache_bytes, args.epochs, args.batches or 2**62)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    for want, got in zip(plain, cached, strict=True):
        if [(n, d) for n, _, d in want] != [(n, d) for n, _, d in got]:
            raise SystemExit("bench: the cached session's assembled batches differ from the plain session's")
    row_bytes = args.feat_dim * 4
    report: dict[str, object] = {"args": vars(args), "cache_rows": rows, "row_bytes": row_bytes, "epochs": []}
    print(f"trainer feature cache {format_size(cache_bytes)} = {rows:,} rows of {row_bytes} B; mode {args.mode}")
    print(f"{'epoch':>5} {'batches':>7} {'rows/batch':>10} {'shipped/batch (no cache)':>24} "
          f"{'shipped/batch (cache)':>21} {'bytes/batch (no cache)':>22} {'bytes/batch (cache)':>19} {'ratio':>6}")
    totals = np.zeros(3)
    for epoch, (want, got) in enumerate(zip(plain, cached, strict=True)):
        n = len(got)
        nodes = sum(r for r, _, _ in want)
        without = sum(s for _, s, _ in want)
        with_cache = sum(s for _, s, _ in got)
        totals += (nodes, without, with_cache)
        ratio = with_cache / without if without else 0.0
        print(f"{epoch:>5} {n:>7} {nodes / n:>10.0f} {without / n:>24.0f} {with_cache / n:>21.0f} "
              f"{without * row_bytes / n:>22.0f} {with_cache * row_bytes / n:>19.0f} {ratio:>6.3f}")
        report["epochs"].append({"epoch": epoch, "batches": n, "rows_per_batch": nodes / n,  # type: ignore[attr-defined]
                                 "shipped_rows_per_batch_without": without / n,
                                 "shipped_rows_per_batch_with": with_cache / n,
                                 "shipped_bytes_per_batch_without": without * row_bytes / n,
                                 "shipped_bytes_per_batch_with": with_cache * row_bytes / n, "ratio": ratio})
    overall = totals[2] / totals[1] if totals[1] else 0.0
    report["ratio"] = overall
    print(f"overall: {overall:.3f} of the rows shipped without a cache")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "trainer_cache_bench.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
