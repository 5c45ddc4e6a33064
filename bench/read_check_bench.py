"""What the read checks cost on the row-granular read path, measured in pairs that see the same load.

bench/compare.py's ``--read-checks both`` runs each mode twice, a minute apart, as two daemons; on a
virtual disk shared with other work the two minutes differ by more than the 5% being measured. This
bench replays the exact mode's reads instead, in one process, checked and unchecked interleaved: for
each of the first ``--batches`` training batches of epoch 0 (the exact mode's seeds, keys and
sampler) it reads

* the in-neighbour lists of the nodes the batch expands (seeds and every hop but the last), through
  the ``NeighborReader`` the exact and static modes use (4 KiB page checks on ``indices.npy``);
* the feature rows of every node of the batch, through their ``RowReader`` (``features.check_block``
  checks on ``features.bin``),

both O_DIRECT, once with the dataset's read checks and once without, back to back, the order
alternating from batch to batch (the second read of a page may find the virtual disk's host cache warm;
alternation gives both sides that advantage equally). No cache sits in front of the reads, so every
row and list of the batch is read and checked: the checks' share of this replay bounds their share of
an exact batch, whose cache hits, sampling and planning are unchecked work beside the same reads.

Reported: per side, the median and total wall and CPU (process) milliseconds per batch; the cost
``checked / unchecked - 1`` of the totals with a bootstrap 95% interval over the batch pairs; and the
cost within each order, to show the order bias the alternation cancels.

    .venv/bin/python bench/read_check_bench.py [--dataset /var/tmp/mb-cmp/dataset] [--batches 96]
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import first_training_batches, machine_description, write_results
from loader.caches.row_reader import RowReader
from loader.daemon.disk_graph import ROW_READ_THREADS
from loader.format.dataset import Dataset, open_dataset
from loader.format.partition_table import row_offsets_for
from loader.format.read_checks import load_read_checks
from loader.sampling.neighbor_reader import NeighborReader
from loader.sampling.sampling import SampledPass
from proto.errors import UserError

SIDES = ("checked", "unchecked")


class ReadPath:
    """The exact mode's two readers over one dataset, with or without its read checks."""

    def __init__(self, dataset: Dataset, checked: bool) -> None:
        m = dataset.manifest
        checks = load_read_checks(dataset, blocks=True) if checked else None
        if checked and checks is None:
            raise UserError(f"{dataset.path}: format {m.version} has no read checks to measure")
        partitions = dataset.partitions()
        self.node_begin, self.feat_offset, self.row_bytes = partitions.node_begin, partitions.feat_offset, m.row_bytes
        self.lists = NeighborReader(dataset.read("indptr", np.int64, 1), Path(dataset.file("indices")),
                                    gap_bytes=4096, read_threads=8, direct_io=True,
                                    page_sums=None if checks is None else checks.index_pages)
        self.rows = RowReader(dataset.file("features"), row_bytes=m.row_bytes, direct=True, threads=ROW_READ_THREADS,
                              block_sums=None if checks is None else checks.feature_blocks,
                              check_block=m.feature_check_bytes)

    def read(self, expanded: np.ndarray, nodes: np.ndarray, out: np.ndarray) -> None:
        self.lists.read(expanded)
        self.rows.read_rows(row_offsets_for(nodes, self.node_begin, self.feat_offset, self.row_bytes), out)

    def close(self) -> None:
        self.lists.close()
        self.rows.close()


def batch_reads(sampled: SampledPass, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(nodes batch ``b`` expands, every node of it), each ascending and distinct, as the readers want."""
    nodes = sampled.nodes[sampled.node_ptr[b]:sampled.node_ptr[b + 1]]
    expanded = int(sampled.num_sampled_nodes[b, :-1].sum())  # the last hop's nodes are only read, not expanded
    return np.unique(nodes[:expanded]), np.unique(nodes)


def timed(path: ReadPath, expanded: np.ndarray, nodes: np.ndarray, out: np.ndarray) -> tuple[float, float]:
    """(wall, CPU) seconds of one batch's reads; CPU is the process's, read threads included."""
    w0, c0 = time.perf_counter(), time.process_time()
    path.read(expanded, nodes, out)
    return time.perf_counter() - w0, time.process_time() - c0


def bootstrap_cost(checked: np.ndarray, unchecked: np.ndarray, seed: int = 0, draws: int = 2000
                   ) -> tuple[float, float]:
    """95% interval of ``sum(checked) / sum(unchecked) - 1`` over resampled batch pairs."""
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(checked), size=(draws, len(checked)))
    costs = checked[pick].sum(axis=1) / unchecked[pick].sum(axis=1) - 1
    return float(np.quantile(costs, 0.025)), float(np.quantile(costs, 0.975))


def replay_read_checks(dataset: Dataset, batches: int, batch_size: int, fanouts: list[int], seed: int = 0,
                       warmup: int = 4) -> dict[str, object]:
    """Read the first ``batches`` batches' lists and rows checked and unchecked, interleaved; the summary."""
    sampled, count = first_training_batches(dataset, batches + warmup, batch_size, fanouts, seed)
    if count <= warmup:
        raise UserError(f"{dataset.path}: {count} training batches, fewer than the {warmup} warm-up ones")
    paths = {side: ReadPath(dataset, side == "checked") for side in SIDES}
    wall: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    checked_first: list[bool] = []
    try:
        width = int(np.diff(sampled.node_ptr).max()) * dataset.manifest.row_bytes
        out = np.empty(width, dtype=np.uint8)
        for b in range(count):
            expanded, nodes = batch_reads(sampled, b)
            view = out[:len(nodes) * dataset.manifest.row_bytes].reshape(len(nodes), -1)
            order = SIDES if b % 2 == 0 else SIDES[::-1]
            for side in order:
                spent_wall, spent_cpu = timed(paths[side], expanded, nodes, view)
                if b >= warmup:  # the first batches compile kernels and fault in the readers' buffers
                    wall[side].append(spent_wall)
                    cpu[side].append(spent_cpu)
            if b >= warmup:
                checked_first.append(order[0] == "checked")
    finally:
        for path in paths.values():
            path.close()
    first = np.array(checked_first)
    result: dict[str, object] = {"batches": count - warmup, "batch_size": batch_size, "fanouts": fanouts,
                                 "rows_per_batch": len(sampled.nodes) / count,
                                 "feature_check_block": dataset.manifest.feature_check_bytes}
    for name, series in (("wall", wall), ("cpu", cpu)):
        c, u = np.array(series["checked"]), np.array(series["unchecked"])
        low, high = bootstrap_cost(c, u)
        result[name] = {
            "checked_ms_median": 1000 * float(np.median(c)), "unchecked_ms_median": 1000 * float(np.median(u)),
            "checked_ms_mean": 1000 * float(c.mean()), "unchecked_ms_mean": 1000 * float(u.mean()),
            "cost": float(c.sum() / u.sum() - 1), "cost_95": [low, high],
            "cost_checked_first": float(c[first].sum() / u[first].sum() - 1),
            "cost_unchecked_first": float(c[~first].sum() / u[~first].sum() - 1)}
    return result


def report_lines(result: dict[str, object]) -> list[str]:
    """Markdown lines of a ``replay_read_checks`` summary."""
    lines = [f"read path replayed ({result['batches']} batches, checked and unchecked interleaved, "
             f"{float(result['rows_per_batch']):,.0f} rows per batch, feature check block "  # type: ignore[arg-type]
             f"{result['feature_check_block']} B; bench/read_check_bench.py):", "",
             "| measure | checked ms/batch (median, mean) | unchecked | cost of the checks | 95% interval | "
             "checked first | unchecked first |", "|---|---|---|---|---|---|---|"]
    for name in ("wall", "cpu"):
        r: dict = result[name]  # type: ignore[assignment]
        lines.append(f"| {name} | {r['checked_ms_median']:.1f}, {r['checked_ms_mean']:.1f} | "
                     f"{r['unchecked_ms_median']:.1f}, {r['unchecked_ms_mean']:.1f} | {100 * r['cost']:+.1f}% | "
                     f"{100 * r['cost_95'][0]:+.1f}% to {100 * r['cost_95'][1]:+.1f}% | "
                     f"{100 * r['cost_checked_first']:+.1f}% | {100 * r['cost_unchecked_first']:+.1f}% |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="/var/tmp/mb-cmp/dataset")
    p.add_argument("--batches", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.batches < 2:
        p.error("--batches: at least 2")
    try:
        dataset = open_dataset(args.dataset)
        result = replay_read_checks(dataset, args.batches, args.batch_size,
                                    [int(f) for f in args.fanouts.split(",")], args.seed)
    except UserError as err:
        print(f"read_check_bench: {err} (bench/compare.py prepares the default dataset)", file=sys.stderr)
        return 2
    text = "\n".join([f"machine: {machine_description()}; dataset {args.dataset}", ""] + report_lines(result))
    print(text)
    write_results("read_checks", args, {"result": result}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
