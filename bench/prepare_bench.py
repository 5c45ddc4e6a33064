"""Benchmark the offline pipeline: edge-cut per partitioner, and prepare's memory bound.

One command, every compared mode in the same run, ratios reported:

    .venv/bin/python bench/prepare_bench.py            # edge-cut + memory bound (~5 min here)
    .venv/bin/python bench/prepare_bench.py --scale    # adds the 10M-node / 200M-edge / 128-dim recipe

Results go to bench/results/prepare-*.json and .md (copy the table into docs/PERFORMANCE.md).
Each prepare runs with the page cache dropped and, when cgroup v1 is available, under a
memory limit of budget + the allowance below, so exceeding the bound fails the run loudly.
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import RESULTS, ROOT, RunResult, machine_description, run_measured

MIB = 1 << 20
OVERHEAD_ALLOWANCE = 384 * MIB
"""cgroup limit headroom over the budget: prepare's FIXED_OVERHEAD_BYTES (192 MiB) plus room for
the page cache of the files being written, which the cgroup also charges (reclaimable)."""

SHARED = ROOT.parent / "shared" / "data"
MEGABATCH = [sys.executable, "-m", "loader.cli", "--no-progress"]


def cli(args: list[str], memory_limit: int | None = None) -> RunResult:
    result = run_measured([*MEGABATCH, *args], memory_limit=memory_limit)
    if result.returncode != 0:
        raise SystemExit(f"bench: {' '.join(args[:2])} failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    return result


def baseline_rss() -> int:
    code = ("import loader.offline.prepare, loader.offline.partition_kernels, pymetis, numpy; "
            "loader.offline.partition_kernels.fennel_assign")
    return run_measured([sys.executable, "-c", code], drop=False).peak_rss_bytes


def edge_cut_section(work: Path) -> list[dict]:
    src = SHARED / "coauthor-physics.npz"
    if not src.exists():
        print("bench: ../shared/data absent; skipping the edge-cut comparison", file=sys.stderr)
        return []
    raw = work / "physics-raw"
    cli(["import", str(src), str(raw), "--format", "npz", "--memory-budget", "1G"])
    rows = []
    for name in ("metis", "stream", "random"):
        out = work / f"physics-{name}"
        result = cli(["prepare", str(raw), str(out), "--partitions", "64", "--partitioner", name])
        manifest = json.loads((out / "manifest.json").read_text())
        rows.append(
            {
                "partitioner": name,
                "partitions": 64,
                "edge_cut": manifest["edge_cut"]["fraction"],
                "partition_seconds": manifest["partitioner"]["seconds"],
                "wall_seconds": result.wall_seconds,
                "peak_rss_bytes": result.peak_rss_bytes,
            }
        )
        shutil.rmtree(out)
    random_cut = next(r["edge_cut"] for r in rows if r["partitioner"] == "random")
    for row in rows:
        row["cut_vs_random"] = row["edge_cut"] / random_cut
    return rows


def memory_section(
    work: Path, nodes: int, avg_degree: float, dim: int, budget: int, label: str, partitioners: tuple[str, ...]
) -> list[dict]:
    raw = work / f"{label}-raw"
    gen = cli(
        [
            "generate",
            str(raw),
            "--nodes",
            str(nodes),
            "--avg-degree",
            str(avg_degree),
            "--feat-dim",
            str(dim),
            "--classes",
            "16",
            "--memory-budget",
            f"{budget // MIB}M",
        ],
        memory_limit=budget + OVERHEAD_ALLOWANCE,
    )
    header = json.loads((raw / "raw.json").read_text())
    graph = {"graph": label, "nodes": nodes, "edges": header["num_edges"], "dim": dim, "budget_bytes": budget,
             "feature_bytes": (raw / "features.npy").stat().st_size}

    def row(step: str, result: RunResult, **extra: object) -> dict:
        return {"step": step, **graph, "wall_seconds": result.wall_seconds, "peak_rss_bytes": result.peak_rss_bytes,
                "cgroup_peak_bytes": result.cgroup_peak_bytes, **extra}

    rows = [row("generate", gen)]
    partitions = max(1, nodes // 4000)
    for name in partitioners:
        out = work / f"{label}-{name}"
        args = ["prepare", str(raw), str(out), "--partitions", str(partitions), "--partitioner", name,
                "--memory-budget", f"{budget // MIB}M"]
        result = cli(args, memory_limit=budget + OVERHEAD_ALLOWANCE)
        manifest = json.loads((out / "manifest.json").read_text())
        rows.append(row(f"prepare ({name})", result, edge_cut=manifest["edge_cut"]["fraction"], partitions=partitions))
        shutil.rmtree(out)
    shutil.rmtree(raw)
    return rows


def markdown(results: dict) -> str:
    lines = [
        f"Machine: {results['machine']}. Baseline RSS of the interpreter with numpy/numba/pymetis "
        f"loaded: {results['baseline_rss_bytes'] / MIB:.0f} MiB.",
        "",
    ]
    if results["edge_cut"]:
        lines += [
            "| coauthor-physics, 64 parts | edge-cut | vs random | partition s | prepare wall s |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['partitioner']} | {100 * r['edge_cut']:.1f}% | {r['cut_vs_random']:.2f}x | "
            f"{r['partition_seconds']:.2f} | {r['wall_seconds']:.1f} |"
            for r in results["edge_cut"]
        ]
        lines.append("")
    lines += [
        "| graph | step | nodes | edges | features | budget | wall s | peak RSS | RSS - budget | edge-cut |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["memory"]:
        cut = f"{100 * r['edge_cut']:.1f}%" if "edge_cut" in r else ""
        lines.append(
            f"| {r['graph']} | {r['step']} | {r['nodes']:,} | {r['edges']:,} | "
            f"{r['feature_bytes'] / MIB:.0f} MiB | {r['budget_bytes'] / MIB:.0f} MiB | {r['wall_seconds']:.1f} | "
            f"{r['peak_rss_bytes'] / MIB:.0f} MiB | {(r['peak_rss_bytes'] - r['budget_bytes']) / MIB:+.0f} MiB "
            f"| {cut} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--work", default="/var/tmp/megabatch-bench", help="scratch directory (needs ~20 GB for --scale)"
    )
    parser.add_argument("--scale", action="store_true", help="also run the 10M-node recipe (~15-30 min)")
    args = parser.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results: dict = {
        "machine": machine_description(),
        "baseline_rss_bytes": baseline_rss(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "edge_cut": edge_cut_section(work),
    }
    # features (1.2M x 256 float32 = 1.2 GB) are >= 4x the 256 MiB budget
    results["memory"] = memory_section(work, 1_200_000, 10, 256, 256 * MIB, "1.2M x 256", ("stream", "random"))
    if args.scale:
        results["memory"] += memory_section(work, 10_000_000, 20, 128, 4096 * MIB, "10M x 128", ("stream",))
    out = RESULTS
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"prepare-{stamp}.json").write_text(json.dumps(results, indent=2))
    table = markdown(results)
    (out / f"prepare-{stamp}.md").write_text(table)
    print(table)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    np.seterr(all="raise")
    main()
