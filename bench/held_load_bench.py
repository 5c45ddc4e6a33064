"""Loading a dataset's features for the in-memory sources: the dense matrix and then its CSR (how the sources loaded
before 2026-11-29) against ``trainer.inmemory_source.load_held`` (partition by partition straight into the CSR),
side by side: seconds, peak RSS and RSS after, and the ratios. Each load runs in a fresh process (a peak RSS is a
process's), the two alternating, ``--repeats`` times each; both build the same CSR (checked by its byte count).

    .venv/bin/python bench/held_load_bench.py --dataset DS [--repeats 2]

Prints a markdown table; nothing is written. The interpreter with torch and numba loaded is part of every RSS.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

WAYS = ("dense", "held")


def load_once(way: str, dataset: str) -> dict[str, float]:
    """One load, in this process: seconds, peak and final RSS (MiB), and the CSR's bytes."""
    from loader.format.dataset import open_dataset
    from loader.sampling.inmemory import load_in_memory
    from trainer.inmemory_source import load_held
    from trainer.sparse_features import sparse_features

    opened = open_dataset(dataset)
    started = time.perf_counter()
    if way == "held":
        _, held = load_held(opened)
    else:
        data = load_in_memory(opened)
        assert data.features is not None
        held = sparse_features(data.features)
    seconds = time.perf_counter() - started
    with open("/proc/self/status") as status:
        rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return {"seconds": seconds, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "after_mib": rss_kib / 1024,
            "csr_bytes": 0 if held is None else held.indptr.nbytes + held.indices.nbytes + held.values.nbytes}


def measure(dataset: str, repeats: int) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for _ in range(repeats):
        for way in WAYS:
            done = subprocess.run([sys.executable, __file__, "--dataset", dataset, "--once", way], capture_output=True,
                                  text=True, env=env, cwd=Path(__file__).resolve().parents[1], check=False)
            if done.returncode != 0:
                sys.exit(f"held_load_bench: the {way} load failed: {done.stderr.strip().splitlines()[-1:]}")
            runs[way].append(json.loads(done.stdout))
    sizes = {run["csr_bytes"] for way in WAYS for run in runs[way]}
    if len(sizes) != 1:
        sys.exit(f"held_load_bench: the two loads built different CSRs ({sorted(sizes)} bytes)")
    return runs


def table(dataset: str, runs: dict[str, list[dict[str, float]]]) -> str:
    def mean(way: str, key: str) -> float:
        return sum(run[key] for run in runs[way]) / len(runs[way])

    def each(way: str, key: str, digits: int) -> str:
        return ", ".join(f"{run[key]:,.{digits}f}" for run in runs[way])

    csr = runs["held"][0]["csr_bytes"]
    lines = [f"{dataset}: CSR of {csr / 2**20:,.1f} MiB" + ("" if csr else " (features too dense: held dense)"), "",
             "| load | seconds (each) | peak RSS MiB (each) | RSS after MiB (each) |", "|---|---|---|---|"]
    for way, label in zip(WAYS, ("dense matrix, then the CSR", "`load_held`, partition by partition"), strict=True):
        lines.append(f"| {label} | {each(way, 'seconds', 2)} | {each(way, 'peak_mib', 0)} | "
                     f"{each(way, 'after_mib', 0)} |")
    lines.append(f"| ratio (dense / held, means) | {mean('dense', 'seconds') / mean('held', 'seconds'):.2f}x | "
                 f"{mean('dense', 'peak_mib') / mean('held', 'peak_mib'):.2f}x | "
                 f"{mean('dense', 'after_mib') / mean('held', 'after_mib'):.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="a prepared dataset")
    parser.add_argument("--repeats", type=int, default=2, help="loads of each way (alternating; default 2)")
    parser.add_argument("--once", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: expected at least 1, got {args.repeats}")
    if not (Path(args.dataset) / "manifest.json").is_file():
        parser.error(f"--dataset: {args.dataset} is not a prepared dataset (no manifest.json)")
    if args.once:
        print(json.dumps(load_once(args.once, args.dataset)))
        return 0
    print(table(args.dataset, measure(args.dataset, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
