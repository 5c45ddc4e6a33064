"""What ``bench/compare.py`` prints and draws: its run names, the side-by-side table with ratios, and the chart
(split from the runner, which starts daemons and measures them)."""

import argparse
import re
import statistics
from pathlib import Path

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import DAEMON_OVERHEAD, machine_description, warn
from bench.read_check_bench import report_lines
from proto.sizes import format_size

__all__ = ["CHECKED_MODES", "UNCHECKED", "AGGREGATED", "RANKED", "run_parts", "is_aggregated", "fmt", "report",
           "chart"]

CHECKED_MODES = ("hierarchical", "exact", "static")
"""The modes that verify what they read (format 1.1 read checks); ``--read-checks both`` runs each unchecked too."""
UNCHECKED = "-unchecked"
AGGREGATED = "-agg"
"""A run with ``[sampler] aggregation_cache = true`` (``--aggregation-cache``)."""
RANKED = re.compile(r"-r(\d+)$")
"""A run serving a job of that many ranks (``--ranks``)."""

def run_parts(run: str) -> tuple[str, bool, int]:
    """(mode, read checks on, ranks) of a run name ``<mode>[-unchecked][-agg][-rW]``."""
    match = RANKED.search(run)
    ranks = int(match.group(1)) if match else 1
    base = (run[:match.start()] if match else run).removesuffix(AGGREGATED)
    return base.removesuffix(UNCHECKED), not base.endswith(UNCHECKED), ranks


def is_aggregated(run: str) -> bool:
    """Whether run ``run`` serves the aggregation cache (its name's ``-agg``)."""
    return RANKED.sub("", run).endswith(AGGREGATED)



def fmt(value: object, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def report(results: list[dict[str, object]], args: argparse.Namespace, budget: int, features: int,
           seq_rates: list[float], replay: dict[str, object] | None = None) -> str:
    seq_rate = float(statistics.median(seq_rates))
    by_mode = {str(r["mode"]): r for r in results}

    def ratio(r: dict[str, object], base: str, key: str) -> str:
        b = by_mode.get(base, {}).get(key)
        v = r.get(key)
        return f"{float(v) / float(b):.2f}x" if b and v else "-"  # type: ignore[arg-type]

    lines = [
        f"machine: {machine_description()}; sequential O_DIRECT read (1 MiB, depth 1) {seq_rate:.0f} MB/s, the "
        f"median of {len(seq_rates)} regions ({min(seq_rates):.0f}-{max(seq_rates):.0f})",
        f"graph: {args.nodes:,} nodes, avg degree {args.avg_degree}, {args.feat_dim}-dim float32, features "
        f"{format_size(features)} = {features / budget:.1f}x the {format_size(budget)} budget; batch "
        f"{args.batch_size}, fanouts [{args.fanouts}], {args.slots} slots, superbatch {args.superbatch} (staged "
        f"{args.staged_superbatch}); cgroup "
        f"limit budget + {format_size(DAEMON_OVERHEAD)} daemon overhead (inmemory: none)"
        + ("; the features fit in that limit, so mmap runs from the page cache" if features <= budget + DAEMON_OVERHEAD
           else ""),
        "",
        "| mode | loader batches/s | seeds/s | vs mmap (batches, seeds) | vs inmemory (batches, seeds) | "
        "epoch (implied) | disk read | feature rows read/used | neighbour hit | sampler s/batch | train samples/s | "
        "train vs mmap | data-wait | peak RSS | cgroup peak | OOM kills | daemon |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        epoch = r.get("epoch_seconds_implied")
        wait = r.get("train_data_wait")
        rss = r.get("daemon_peak_rss")
        lines.append(
            f"| {r['mode']} | {fmt(r.get('batches_per_s'), '.2f')} | {fmt(r.get('seeds_per_s'), '.0f')} | "
            f"{ratio(r, 'mmap', 'batches_per_s')}, {ratio(r, 'mmap', 'seeds_per_s')} | "
            f"{ratio(r, 'inmemory', 'batches_per_s')}, {ratio(r, 'inmemory', 'seeds_per_s')} | "
            f"{fmt(epoch, '.0f')} s | "
            f"{format_size(float(r.get('disk_bytes', 0)))} | "  # type: ignore[arg-type]
            f"{fmt(r.get('feature_miss_ratio'), '.3f')} | {fmt(r.get('neighbor_hit_ratio'), '.3f')} | "
            f"{fmt(r.get('sampler_seconds_per_batch'), '.3f')} | {fmt(r.get('train_samples_per_s'), '.0f')} | "
            f"{ratio(r, 'mmap', 'train_samples_per_s')} | {fmt(wait, '.0%')} | "
            f"{format_size(float(rss)) if rss else '-'} | "  # type: ignore[arg-type]
            f"{format_size(float(r['cgroup_peak'])) if r.get('cgroup_peak') else '-'} | "  # type: ignore[arg-type]
            f"{r.get('oom_kills', '-')} | "
            f"{r.get('failure') or 'exit ' + str(r.get('daemon_exit', '-'))} |")
    exact, hier = by_mode.get("exact", {}), by_mode.get("hierarchical", {})
    if exact.get("planner_over_sampler") is not None:
        lines.append(f"\nchangeset planning / superbatch sampling time (exact): "
                     f"{100 * float(exact['planner_over_sampler']):.1f}%")  # type: ignore[arg-type]
    for mode in CHECKED_MODES:
        checked, unchecked = by_mode.get(mode, {}), by_mode.get(mode + UNCHECKED, {})
        if checked.get("batches_per_s") and unchecked.get("batches_per_s"):
            cost = 1 - float(checked["batches_per_s"]) / float(unchecked["batches_per_s"])  # type: ignore[arg-type]
            cpu = float(checked.get("daemon_cpu_s_per_batch") or 0)  # type: ignore[arg-type]
            cpu_off = float(unchecked.get("daemon_cpu_s_per_batch") or 0)  # type: ignore[arg-type]
            cpu_text = f"; daemon CPU per batch {1000 * cpu:.1f} vs {1000 * cpu_off:.1f} ms " \
                f"({100 * (cpu / cpu_off - 1):+.1f}%)" if cpu and cpu_off else ""
            lines.append(f"read checks ({mode}): {float(checked['batches_per_s']):.2f} batches/s checked vs "  # type: ignore[arg-type]
                         f"{float(unchecked['batches_per_s']):.2f} unchecked ({100 * cost:+.1f}% of throughput)"  # type: ignore[arg-type]
                         f"{cpu_text}")
    if replay is not None:
        lines += [""] + report_lines(replay) + [""]
    for r in results:
        mode, checked, ranks = run_parts(str(r["mode"]))
        single = by_mode.get(mode if checked else mode + UNCHECKED, {})
        if ranks > 1 and r.get("batches_per_s") and single.get("batches_per_s"):
            per_batch, single_per_batch = r.get("disk_bytes_per_batch"), single.get("disk_bytes_per_batch")
            disk = f"{format_size(float(per_batch))} vs {format_size(float(single_per_batch))} " \
                f"({float(per_batch) / float(single_per_batch):.2f}x)" if per_batch and single_per_batch else "-"  # type: ignore[arg-type]
            lines.append(f"{ranks} ranks ({r['mode']}): {float(r['batches_per_s']):.2f} batches/s over all ranks vs "  # type: ignore[arg-type]
                         f"{float(single['batches_per_s']):.2f} for one trainer "  # type: ignore[arg-type]
                         f"({float(r['batches_per_s']) / float(single['batches_per_s']):.2f}x); disk read per "  # type: ignore[arg-type]
                         f"delivered batch {disk}")
    lines.append("\nwhere a batch's time goes (stage busy ms per batch; the stages overlap, so the largest bounds "
                 "the rate; row reads are part of publishing):")
    for r in results:
        stages = r.get("stage_ms_per_batch")
        if isinstance(stages, dict) and r.get("batches_per_s"):
            wall = 1000 / float(r["batches_per_s"])  # type: ignore[arg-type]
            parts = ", ".join(f"{stage} {ms:.1f}" for stage, ms in stages.items() if ms > 0.05)
            lines.append(f"- {r['mode']}: {wall:.1f} ms per batch; {parts}")
    pairs = [(r, by_mode[str(r["mode"])[:-len(AGGREGATED)]]) for r in results
             if str(r["mode"]).endswith(AGGREGATED) and str(r["mode"])[:-len(AGGREGATED)] in by_mode]
    if pairs:
        lines += ["", "aggregation cache (BatchGNN), each mode with it against the same mode without it, same run:", "",
                  "| mode | rows per batch without / with (predicted) | rows per batch without / with (delivered) | "
                  "disk read per batch without / with (of it x_agg) | loader batches/s without / with | "
                  "seeds/s ratio | train samples/s without / with |",
                  "|---|---|---|---|---|---|---|"]
        for agg, plain in pairs:
            rows = agg.get("estimated_rows") or {}
            per_batch, plain_per_batch = agg.get("disk_bytes_per_batch"), plain.get("disk_bytes_per_batch")
            x_agg = agg.get("aggregate_disk_bytes_per_batch")
            lines.append(
                f"| {plain['mode']} | {rows.get('without', '-')} / {rows.get('with', '-')} | "  # type: ignore[union-attr]
                f"{fmt(plain.get('rows_per_batch'), ',.0f')} / {fmt(agg.get('rows_per_batch'), ',.0f')} | "
                f"{format_size(float(plain_per_batch)) if plain_per_batch else '-'} / "  # type: ignore[arg-type]
                f"{format_size(float(per_batch)) if per_batch else '-'} "  # type: ignore[arg-type]
                f"({format_size(float(x_agg)) if x_agg else '-'}) | "  # type: ignore[arg-type]
                f"{fmt(plain.get('batches_per_s'), '.2f')} / {fmt(agg.get('batches_per_s'), '.2f')} | "
                f"{ratio(agg, str(plain['mode']), 'seeds_per_s')} | "
                f"{fmt(plain.get('train_samples_per_s'), '.0f')} / {fmt(agg.get('train_samples_per_s'), '.0f')} |")
    staged = by_mode.get("staged", {})
    if staged.get("disk_read_mb_s") is not None and staged.get("staging_written_mb_s") is not None:
        read, written = float(staged["disk_read_mb_s"]), float(staged["staging_written_mb_s"])  # type: ignore[arg-type]
        lines.append(f"staged: the disk read {read:.0f} MB/s and took {written:.0f} MB/s of staging writes while it "
                     f"served, {(read + written) / seq_rate:.2f}x the sequential O_DIRECT rate (reads alone "
                     f"{read / seq_rate:.2f}x)")
    if hier.get("hier_read_mb_s") is not None:
        rate = float(hier["hier_read_mb_s"])  # type: ignore[arg-type]
        lines.append(f"hierarchical mega-batch reads: {rate:.0f} MB/s while reading = {rate / seq_rate:.2f}x the "
                     f"sequential O_DIRECT rate")
    return "\n".join(lines)


def chart(results: list[dict[str, object]], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warn("matplotlib is not installed (pip install '.[bench]'); no PNG chart")
        return
    modes = [str(r["mode"]) for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "batches_per_s", "loader-only batches/s"),
                           (axes[1], "train_samples_per_s", "GraphSAGE samples/s")):
        values = [float(r.get(key) or 0) for r in results]  # type: ignore[arg-type]
        ax.bar(modes, values, color=["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"][:len(modes)])
        ax.set_title(title)
        ax.set_yscale("log")
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.2g}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
