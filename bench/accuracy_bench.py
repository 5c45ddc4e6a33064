"""Accuracy through the daemon vs in-memory neighbour sampling (HierBatching Table 2 and its ablation).

For each dataset (coauthor-cs, coauthor-physics from ../shared/data, seeded stratified 60/20/20 split)
and each seed: GraphSAGE trained (1) in memory ("NS"), (2) through the daemon with the static cache
("HB"), (3) through the daemon without it ("HB-s"), same hyper-parameters, N_d / N_p = 1/4. Reports the
test accuracy at the best validation epoch, mean over seeds, and the differences to NS.

    .venv/bin/python bench/accuracy_bench.py [--datasets coauthor-cs,coauthor-physics] [--seeds 0,1,2]
                                             [--epochs 10] [--partitions 32]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SHARED = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "bench" / "results"


def run(cmd: list[str], **kw: object) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def prepare(name: str, work: Path, partitions: int) -> Path:
    raw, out = work / f"{name}-raw", work / f"{name}-ds"
    if not out.exists():
        run([PY, "-m", "loader.cli", "-q", "import", str(SHARED / f"{name}.npz"), str(raw), "--format", "npz",
             "--split", "0.6,0.2,0.2", "--split-seed", "0"])
        run([PY, "-m", "loader.cli", "-q", "prepare", str(raw), str(out), "--partitions", str(partitions),
             "--memory-budget", "2G"])
    return out


def write_config(path: Path, dataset: Path, sock: Path, seed: int, static: bool, args: argparse.Namespace) -> None:
    path.write_text(f"""
[dataset]
path = "{dataset}"
[memory]
budget = "{args.budget}"
[hierarchy]
megabatch_fraction = 0.25
static_cache = {str(static).lower()}
passes = 1
[sampler]
batch_size = {args.batch_size}
fanouts = [{args.fanouts}]
eval_fanouts = [{args.fanouts}]
eval_batch_size = {args.batch_size}
seed = {seed}
[publisher]
slots = 3
[server]
socket = "{sock}"
max_clients = 1
[metrics]
port = 0
""")


def train_args(seed: int, out: Path, args: argparse.Namespace) -> list[str]:
    return ["--model", "sage", "--hidden", "256", "--dropout", "0.5", "--lr", "0.003", "--epochs", str(args.epochs),
            "--seed", str(seed), "--json-out", str(out), "--no-progress", "-q"]


def one_run(mode: str, dataset: Path, seed: int, work: Path, args: argparse.Namespace) -> dict[str, object]:
    out = work / f"{dataset.name}-{mode}-{seed}.json"
    t0 = time.monotonic()
    if mode == "NS":
        run([PY, "-m", "trainer", "--mode", "inmemory", "--dataset", str(dataset), "--batch-size",
             str(args.batch_size), "--fanouts", args.fanouts, "--eval-fanouts", args.fanouts, "--eval-batch-size",
             str(args.batch_size), "--sampler-seed", str(seed), *train_args(seed, out, args)])
    else:
        sock = work / f"{mode}.sock"
        config = work / f"{mode}.toml"
        write_config(config, dataset, sock, seed, mode == "HB", args)
        daemon = subprocess.Popen([PY, "-m", "loader.cli", "-q", "serve", "--config", str(config)])
        try:
            run([PY, "-m", "trainer", "--socket", str(sock), "--connect-timeout", "120",
                 *train_args(seed, out, args)])
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
    result = json.loads(out.read_text())
    result["wall_seconds"] = time.monotonic() - t0
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="coauthor-cs,coauthor-physics")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanouts", default="10,5")
    parser.add_argument("--budget", default="8G")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    table: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="mb-acc-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        for name in args.datasets.split(","):
            dataset = prepare(name, work, args.partitions)
            for mode in ("NS", "HB", "HB-s"):
                for seed in seeds:
                    result = one_run(mode, dataset, seed, work, args)
                    acc = float(result["test_acc_at_best"])  # type: ignore[arg-type]
                    table.setdefault(name, {}).setdefault(mode, []).append(acc)
                    print(f"{name} {mode} seed {seed}: test {acc:.4f} ({result['wall_seconds']:.0f} s)", flush=True)
    lines = ["| dataset | NS (in memory) | HB (daemon, static cache) | HB-s (no static cache) | HB - NS | HB-s - NS |",
             "|---|---|---|---|---|---|"]
    for name, modes in table.items():
        mean = {m: sum(v) / len(v) for m, v in modes.items()}
        lines.append(f"| {name} | {mean['NS']:.4f} | {mean['HB']:.4f} | {mean['HB-s']:.4f} | "
                     f"{100 * (mean['HB'] - mean['NS']):+.2f} pt | {100 * (mean['HB-s'] - mean['NS']):+.2f} pt |")
    report = "\n".join(lines)
    print(report)
    stem = "accuracy-" + "-".join(table)  # one file per dataset set, so runs of other datasets are kept
    (RESULTS / f"{stem}.json").write_text(json.dumps({"args": vars(args), "test_acc": table}, indent=2))
    (RESULTS / f"{stem}.md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
