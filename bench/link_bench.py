"""Link prediction in MariusGNN's partition buffer orders vs a shuffled epoch, in memory, and through the daemon
(issue 31).

This measures what a partition buffer order alone costs, in memory: ``--link-order comet`` and ``beta``
train each edge bucket while its two partitions are in a buffer of C of the P partitions, with negatives and
neighbours from the buffer only (trainer/link/inmemory.py), against ``shuffled``, every training edge in one
random order over the whole graph. ``daemon`` trains the shuffled order's batches as a user does out of
core: ``megabatch serve`` in mode exact serves them (bitwise shuffled's) and the trainer reads them through its
socket. Evaluation is the same for all (the full graph, each held-out positive ranked among its fixed negative
tails).

Orders ``comet-global-neighbours``, ``comet-uniform-negatives`` and ``comet-widened`` (not run by default) are
COMET with one or two of its changes undone (``bench/link_variants.py``): what its gap is made of.

Every shared graph (../shared/data, default cora-planetoid, citeseer-planetoid, amazon-photo) is
imported once per ``--work`` directory with ``import --task link`` (0.85/0.05/0.10 split by pair,
seed 0, 100 negatives per held-out positive) and prepared with METIS into ``--partitions`` P (32).
Then per seed S (model seed = sampler seed) and order, GraphSAGE (hidden 128, MLP decoder, batch 256,
fanouts 10,5, one training negative per positive) trains for up to ``--max-epochs`` (100) epochs with
early stopping on validation MRR (``--patience`` 10):

    python -m trainer --mode inmemory --dataset DS --task link --model sage --hidden 128 --decoder mlp
        --batch-size 256 --fanouts 10,5 --sampler-seed S --seed S --epochs MAX --patience PAT
        --lr LR --ema DECAY --json-out OUT --no-progress -q [--link-order comet|beta --buffer-partitions C]

with LR = ``--lr`` and DECAY = ``--ema`` (default the trainer's for ``--task link``), C = ``--buffer-partitions``
(default P/4) and COMET's logical partitions MariusGNN's default
(``--logical-partitions`` passes its own).

Reported per graph (bench/results/link-<graphs>[-tag].{md,json}): per order the test MRR, Hits@10 and
ROC AUC at the best validation epoch (mean of the seeds, then each seed), the MRR's difference to
shuffled in points (seed by seed, with the standard error of the mean difference: ``paired_gap``), the
best epoch, the epochs to accuracy (the first epoch whose validation MRR reaches shuffled's mean best
validation MRR minus 1 point, mean over the seeds that reach it, "never" if none) and the seconds of training
and evaluation to it (time to accuracy; runs that share the cores slow each other), the buffer states and
the partitions an epoch reads (``BufferPlan.io_partitions``: what the order would
cost out of core; shuffled reads the whole graph and has no plan), and seconds of training per epoch.

Usage (cora takes minutes per run on 2 cores, amazon-photo far longer; keep --work to rerun without
importing and preparing, and --reuse to resume: finished runs are read back, and an in-memory run cut short, by a
kill or a session's end, continues from the checkpoint of its last whole epoch, ending as it would have uninterrupted
by the same code. Each launch of a run's trainer records the commit it runs from (``RUNS/STEM.code.json``), and the
report says whether one commit trained every run or which runs ran which, so a table that mixes code versions says so).
A finished run keeps its last checkpoint (``RUNS/STEM.last.ckpt``), so under --reuse a larger ``--max-epochs``
continues each run of a smaller cap from it instead of training its epochs again (a run that stopped early is
taken as it is: early stopping does not depend on the cap):

    .venv/bin/python bench/link_bench.py [--work /var/tmp/mb-link]
    .venv/bin/python bench/link_bench.py --datasets cora-planetoid --seeds 0 --max-epochs 2 --tag smoke
"""

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import RESULTS, ROOT, code_version, machine_description, sh, stop_process
from proto.atomic import atomic_file
from trainer.link.options import DEFAULT_BUFFER_LR, DEFAULT_EMA, DEFAULT_LINK_LR, default_lr, ema_decay

__all__ = ["DATASETS", "ORDERS", "UNWEIGHTED_ORDERS", "BUCKET_ORDERS", "LinkRun", "OrderSummary", "parse_args",
           "run_stem", "shorter_run", "continue_shorter_run", "train_command", "read_run", "summarize", "paired_gap",
           "dataset_markdown", "record_launch", "read_launches", "run_code", "code_markdown", "main"]

PY = sys.executable
SHARED = ROOT.parent / "shared" / "data"
DATASETS = ("cora-planetoid", "citeseer-planetoid", "amazon-photo")
VARIANT_ORDERS = ("comet-global-neighbours", "comet-uniform-negatives", "comet-widened", "comet-hybrid-negatives",
                  "comet-source-weighted-negatives", "comet-tail-batches")
"""COMET with one or two of its changes undone, in memory (``bench/link_variants.py``): what its gap is made of.
Each takes apart plain COMET, its negatives unweighted (``--no-negative-weights``), except ``WEIGHTED_VARIANTS``."""
WEIGHTED_VARIANTS = ("comet-tail-batches",)
"""Variants of the product's COMET (weighted negatives): what one of its later changes bought."""
UNWEIGHTED_ORDERS = ("comet-unweighted", "beta-unweighted")
"""The buffer orders as MariusGNN has them: negatives from the buffer, unweighted (``--no-negative-weights``;
``comet`` and ``beta`` weigh them, the trainer's default)."""
DEFAULT_ORDERS = ("shuffled", "comet", "beta", "daemon")
"""``daemon``: the shuffled order's batches served by ``megabatch serve`` in mode ``exact`` (``DAEMON_BUDGET``), the
trainer reading them through its socket: the out-of-core path a user runs (its batches are shuffled's, bitwise)."""
UNBUFFERED_ORDERS = ("shuffled", "daemon")
"""The orders over the whole graph: no buffer in their names or commands, the shuffled order's default lr."""
BUCKET_ORDERS = ("comet-bucket-assignment",)
"""COMET trained with ``--link-assignment bucket``: each bucket whole in one state, MariusGNN's form, as every COMET
run before 2026-11-29 was; since then COMET splits each bucket among its co-resident states (the trainer's default)
and its runs, the variants' too, are named ``-edges``, so --reuse never takes a run of the other assignment (the
earlier ``comet`` runs are ``comet-bucket-assignment``'s)."""
ORDERS = (*DEFAULT_ORDERS, *UNWEIGHTED_ORDERS, *BUCKET_ORDERS, *VARIANT_ORDERS)
"""Every order ``--orders`` takes; the unweighted and variant orders are not in the default."""
DAEMON_BUDGET = "256M"
DEFAULT_MAX_EPOCHS, DEFAULT_PATIENCE, DEFAULT_FANOUTS = 100, 10, "10,5"
UNNAMED_LR = 0.003
"""The learning rate of runs whose names carry no ``-lr``: every run before the link task got its own default
(``DEFAULT_LINK_LR``, 2026-11-29) trained at the trainer's 0.003 and was named without it; a run at any other lr
is named with it, so --reuse never mistakes one for the other."""
TARGET_GAP = 0.01
"""Epochs to accuracy count to shuffled's mean best validation MRR minus this (1 point)."""

TRAJECTORY_EVERY = 10
"""The report's gap over training: the orders' best validation MRR so far every this many epochs."""


@dataclass(frozen=True)
class LinkRun:
    """One training run, from its ``--json-out``: validation MRR per evaluated epoch and the scores at the best."""

    order: str
    seed: int
    val_mrr: list[tuple[int, float]]
    """(epoch, validation MRR) of every evaluated epoch with a defined MRR."""
    best_epoch: int
    best_val_mrr: float
    test: dict[str, float]
    """Every test score at the best validation epoch (mrr, hits@10, roc_auc, ...)."""
    epochs_run: int
    states: list[int]
    """Buffer states per epoch (empty for shuffled)."""
    loads: list[int]
    """Physical partitions read per epoch (empty for shuffled)."""
    train_s: float
    """Seconds of training per epoch, mean."""
    elapsed_s: list[tuple[int, float]]
    """(epoch, seconds of training and evaluation from the start through that epoch) of every epoch."""
    code: tuple[str, ...] = ("unknown",)
    """The commits its trainer ran from, first to last (a run resumed after a commit has two); "unknown" for a run
    started before the bench recorded them."""

    def best_after(self, epoch: int) -> float | None:
        """The best validation MRR of the epochs up to ``epoch`` (a run that stopped early keeps its best), None
        before its first evaluated epoch."""
        seen = [mrr for e, mrr in self.val_mrr if e <= epoch]
        return max(seen) if seen else None

    def epochs_to(self, target: float) -> int | None:
        """The first epoch whose validation MRR reaches ``target``, None if none does."""
        return next((epoch for epoch, mrr in self.val_mrr if mrr >= target), None)

    def seconds_to(self, target: float) -> float | None:
        """Seconds of training and evaluation through the first epoch whose validation MRR reaches ``target``."""
        epoch = self.epochs_to(target)
        return None if epoch is None else next(s for e, s in self.elapsed_s if e == epoch)


@dataclass(frozen=True)
class OrderSummary:
    """One order's runs on one graph, in the report's terms (per-epoch figures: means over every epoch of every
    seed; None where there is nothing to average: shuffled has no buffer states)."""

    order: str
    seeds: list[int]
    mrr: list[float]
    hits10: list[float]
    auc: list[float]
    best_epoch: list[int]
    epochs_run: list[int]
    epochs_to_target: list[int | None]
    seconds_to_target: list[float | None]
    """Training and evaluation seconds to the target (time to accuracy; runs sharing the cores slow each other)."""
    states_per_epoch: float | None
    loads_per_epoch: float | None
    train_s_per_epoch: float | None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated shared graphs")
    parser.add_argument("--orders", default=",".join(DEFAULT_ORDERS),
                        help=f"comma-separated subset of {','.join(ORDERS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--partitions", type=int, default=32, help="prepare --partitions P (default 32)")
    parser.add_argument("--partitioner", choices=("metis", "random", "stream"), default="metis",
                        help="prepare --partitioner (default metis; MariusGNN partitions at random)")
    parser.add_argument("--buffer-partitions", type=int, default=None, help="C (default P/4)")
    parser.add_argument("--logical-partitions", type=int, default=None, help="COMET's L (default MariusGNN's)")
    parser.add_argument("--max-epochs", type=int, default=DEFAULT_MAX_EPOCHS)
    parser.add_argument("--patience", type=int, default=DEFAULT_PATIENCE)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--fanouts", default=DEFAULT_FANOUTS)
    parser.add_argument("--ema", type=ema_decay, default=DEFAULT_EMA,
                        help=f"the trainer's --ema (default its {DEFAULT_EMA}; 0: evaluate the last weights, as every "
                             "run before 2026-11-28 did)")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"the trainer's --lr, for every order (default the trainer's for each: {DEFAULT_LINK_LR} "
                             f"for shuffled and daemon, {DEFAULT_BUFFER_LR} for the buffer orders and their variants)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--reuse", action="store_true", help="read runs whose result is already in --work")
    parser.add_argument("--tag", default="", help="appended to the result files' names")
    parser.add_argument("--work", type=Path, help="datasets, runs and logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    args.datasets = args.datasets.split(",")
    args.orders = args.orders.split(",")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    unknown = sorted(set(args.orders) - set(ORDERS))
    if unknown:
        parser.error(f"--orders: unknown {', '.join(unknown)} (choose from {', '.join(ORDERS)})")
    if args.lr is not None and not (args.lr > 0 and math.isfinite(args.lr)):
        parser.error(f"--lr {args.lr}: need a positive number")
    if args.buffer_partitions is None:
        args.buffer_partitions = max(2, args.partitions // 4)
    if not 2 <= args.buffer_partitions < args.partitions:
        parser.error(f"--buffer-partitions {args.buffer_partitions}: need 2 <= C < --partitions {args.partitions}")
    return args


def run_lr(order: str, args: argparse.Namespace) -> float:
    """The lr an order's runs train at: ``--lr``, or the trainer's default for the order (a buffer order's own)."""
    if args.lr is not None:
        return args.lr
    return default_lr("shuffled" if order in UNBUFFERED_ORDERS else "comet")


def run_stem(name: str, order: str, seed: int, args: argparse.Namespace) -> str:
    """A run's file names: they name what the run depends on, so --reuse never takes another setting's run."""
    buffer = "" if order in UNBUFFERED_ORDERS else f"-c{args.buffer_partitions}"
    if order.startswith("comet") and args.logical_partitions is not None:
        buffer += f"-l{args.logical_partitions}"
    if order.startswith("comet") and order not in BUCKET_ORDERS:
        buffer += "-edges"
    partitions = f"p{args.partitions}" + ("" if args.partitioner == "metis" else f"-{args.partitioner}")
    # settings at their defaults add nothing, so the runs named before they were named stay reusable; those runs
    # evaluated their last weights, so a moving average is named unless it is off
    training = "".join(f"-{key}{str(value).replace(',', '_')}" for key, value, default in (
        ("f", args.fanouts, DEFAULT_FANOUTS), ("e", args.max_epochs, DEFAULT_MAX_EPOCHS),
        ("pat", args.patience, DEFAULT_PATIENCE), ("lr", run_lr(order, args), UNNAMED_LR), ("ema", args.ema, 0.0))
        if value != default)
    return f"{name}-{partitions}-{order}{buffer}-b{args.batch_size}{training}-seed{seed}"


def daemon_config(dataset: Path, socket: Path, seed: int, args: argparse.Namespace) -> str:
    """The ``daemon`` order's ``megabatch serve`` config: mode exact, the bench's sampler settings."""
    fanouts = ", ".join(args.fanouts.split(","))
    return (f'[dataset]\npath = "{dataset}"\n[loader]\nmode = "exact"\n[memory]\nbudget = "{DAEMON_BUDGET}"\n'
            f"[sampler]\nbatch_size = {args.batch_size}\nfanouts = [{fanouts}]\neval_fanouts = [{fanouts}]\n"
            f'seed = {seed}\n[server]\nsocket = "{socket}"\n[metrics]\nport = 0\n')


def train_command(dataset: Path, order: str, seed: int, out: Path, args: argparse.Namespace,
                  socket: Path | None = None) -> list[str]:
    """The trainer's command line (``socket``: the ``daemon`` order's daemon, whose config sets the sampler)."""
    source = ["--socket", str(socket), "--connect-timeout", "600"] if order == "daemon" else [
        "--mode", "inmemory", "--dataset", str(dataset), "--batch-size", str(args.batch_size), "--fanouts",
        args.fanouts, "--sampler-seed", str(seed)]
    variant = order in VARIANT_ORDERS
    program = [PY, str(ROOT / "bench" / "link_variants.py"), order] if variant else [PY, "-m", "trainer"]
    command = [*program, *source, "--task", "link", "--model", "sage", "--hidden", "128", "--decoder",
               "mlp", "--seed", str(seed), "--epochs", str(args.max_epochs), "--patience", str(args.patience),
               "--lr", str(run_lr(order, args)), "--device", args.device, "--ema", str(args.ema), "--json-out",
               str(out), "--no-progress", "-q"]
    if order not in UNBUFFERED_ORDERS:
        beta = order.startswith("beta")
        command += ["--link-order", "beta" if beta else "comet", "--buffer-partitions", str(args.buffer_partitions)]
        if not beta and args.logical_partitions is not None:
            command += ["--logical-partitions", str(args.logical_partitions)]
        if order in UNWEIGHTED_ORDERS or (variant and order not in WEIGHTED_VARIANTS):
            command.append("--no-negative-weights")
        if order in BUCKET_ORDERS:
            command += ["--link-assignment", "bucket"]
    return command


def record_launch(path: Path, resumed: bool) -> None:
    """Add this launch of a run's trainer, with the code it runs (``code_version``), to the run's ``path``
    (``STEM.code.json``, a list; written whole to a temporary file, then renamed)."""
    launches = read_launches(path) if resumed else []
    launches.append({"commit": code_version(), "resumed": resumed})
    with atomic_file(path, "w") as sink:
        json.dump(launches, sink)


def read_launches(path: Path) -> list[dict]:
    """The launches ``record_launch`` kept for a run; none for a run started before the bench recorded them."""
    try:
        launches = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return launches if isinstance(launches, list) else []


def run_code(launches: list[dict]) -> tuple[str, ...]:
    """The distinct commits of a run's launches, in order; ("unknown",) where none was recorded, with "unknown"
    first where the run was resumed from a launch that was not."""
    commits = [str(launch.get("commit", "unknown")) for launch in launches]
    if not commits or launches[0].get("resumed"):
        commits.insert(0, "unknown")
    return tuple(dict.fromkeys(commits))


def code_markdown(runs: dict[str, list[LinkRun]]) -> str:
    """One line saying which code trained the runs: one commit, or which runs ran which."""
    every = [run for group in runs.values() for run in group]
    commits = {commit for run in every for commit in run.code}
    if len(commits) == 1 and all(len(run.code) == 1 for run in every):
        return f"Code: every run at `{next(iter(commits))}`.\n"
    parts = [f"{run.order} seed {run.seed}: " + " then ".join(f"`{c}`" for c in run.code) for run in every]
    return "Code: the runs were trained by more than one version (" + "; ".join(parts) + ").\n"


def read_run(order: str, seed: int, data: dict, code: tuple[str, ...] = ("unknown",)) -> LinkRun:
    """A ``LinkRun`` from a trainer's ``--json-out`` (parsed) and the commits ``code`` it ran from."""
    epochs = data["epochs"]
    val = [(int(e["epoch"]), float(e["val"]["mrr"])) for e in epochs
           if e.get("val") is not None and e["val"].get("mrr") is not None]
    if data.get("best_epoch") is None or data.get("test_at_best") is None:
        raise ValueError("no evaluated epoch with a defined validation MRR")
    return LinkRun(order, seed, val, int(data["best_epoch"]), float(data["best_val"]["mrr"]),
                   {k: float("nan") if v is None else float(v) for k, v in data["test_at_best"].items()},
                   len(epochs), [int(e["buffer_states"]) for e in epochs if e.get("buffer_states") is not None],
                   [int(e["partition_loads"]) for e in epochs if e.get("partition_loads") is not None],
                   _mean([float(e["train_s"]) for e in epochs]), _elapsed(epochs), code)


def _elapsed(epochs: list[dict]) -> list[tuple[int, float]]:
    total, out = 0.0, []
    for e in epochs:
        total += float(e["train_s"]) + float(e.get("eval_s") or 0.0)
        out.append((int(e["epoch"]), total))
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _defined(value: float) -> float | None:
    """A mean of nothing (NaN) as None, "-" in the table and null in the JSON."""
    return None if math.isnan(value) else value


def summarize(runs: dict[str, list[LinkRun]]) -> tuple[float | None, list[OrderSummary]]:
    """(the target validation MRR, one summary per order in ``runs``' order); no target without shuffled runs."""
    shuffled = runs.get("shuffled", [])
    target = _mean([r.best_val_mrr for r in shuffled]) - TARGET_GAP if shuffled else None
    summaries = []
    for order, group in runs.items():
        summaries.append(OrderSummary(
            order, [r.seed for r in group], [r.test["mrr"] for r in group], [r.test["hits@10"] for r in group],
            [r.test["roc_auc"] for r in group], [r.best_epoch for r in group], [r.epochs_run for r in group],
            [None if target is None else r.epochs_to(target) for r in group],
            [None if target is None else r.seconds_to(target) for r in group],
            _defined(_mean([s for r in group for s in r.states])), _defined(_mean([x for r in group for x in r.loads])),
            _defined(_mean([r.train_s for r in group]))))
    return target, summaries


def _scores(values: list[float]) -> str:
    each = ", ".join(f"{v:.3f}" for v in values)
    return f"{_mean(values):.4f} ({each})" if len(values) > 1 else f"{_mean(values):.4f}"


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _reached(values: Sequence[float | None], has_target: bool, digits: int = 1) -> str:
    if not has_target:
        return "-"
    reached = [v for v in values if v is not None]
    if not reached:
        return "never"
    missed = f" ({len(values) - len(reached)} never)" if len(reached) < len(values) else ""
    return f"{_mean(reached):.{digits}f}{missed}"


def paired_gap(order: OrderSummary, base: OrderSummary) -> str:
    """``order``'s test MRR minus ``base``'s in points, over the seeds both ran (a seed is the same model
    initialisation and sampler seed in both, so the difference is taken seed by seed), with the standard error
    of that mean difference where two or more seeds give one: "-1.2 ± 0.6"."""
    mine = dict(zip(order.seeds, order.mrr, strict=True))
    theirs = dict(zip(base.seeds, base.mrr, strict=True))
    diffs = [100 * (mine[s] - theirs[s]) for s in mine if s in theirs]
    if not diffs:
        return "-"
    mean = sum(diffs) / len(diffs)
    if len(diffs) < 2:
        return f"{mean:+.1f}"
    spread = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
    return f"{mean:+.1f} ± {spread:.1f}"


def dataset_markdown(name: str, target: float | None, summaries: list[OrderSummary], buffer: str) -> str:
    """One graph's section: a row per order."""
    base = next((s for s in summaries if s.order == "shuffled"), None)
    lines = [f"## {name}", "",
             f"{buffer}; target validation MRR "
             + ("-" if target is None else f"{target:.4f} (shuffled's mean best minus 1 point)") + ".", "",
             "| order | test MRR (per seed) | vs shuffled (points, paired by seed ± s.e.) | Hits@10 | ROC AUC | "
             "best epoch | epochs run | epochs to target | s to target (train + eval) | states / epoch | "
             "partitions read / epoch | train s / epoch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        delta = "-" if base is None or s.order == "shuffled" else paired_gap(s, base)
        lines.append(f"| {s.order} | {_scores(s.mrr)} | {delta} | {_scores(s.hits10)} | {_scores(s.auc)} | "
                     f"{_mean(s.best_epoch):.1f} | {_mean(s.epochs_run):.1f} | "
                     f"{_reached(s.epochs_to_target, target is not None)} | "
                     f"{_reached(s.seconds_to_target, target is not None, 0)} | {_number(s.states_per_epoch)} | "
                     f"{_number(s.loads_per_epoch)} | {_number(s.train_s_per_epoch, 2)} |")
    return "\n".join(lines) + "\n"


def trajectory(runs: dict[str, list[LinkRun]], every: int = TRAJECTORY_EVERY) -> dict[str, list[tuple[int, float]]]:
    """Per order, (epoch, its seeds' mean best validation MRR so far) every ``every`` epochs and at the last epoch any
    run trained; an epoch where some seed has no evaluated epoch yet is left out."""
    last = max((r.epochs_run for group in runs.values() for r in group), default=0)
    marks = sorted({*range(every, last + 1, every), last} - {0})
    out: dict[str, list[tuple[int, float]]] = {}
    for order, group in runs.items():
        points = []
        for mark in marks:
            bests = [r.best_after(mark) for r in group]
            if group and all(b is not None for b in bests):
                points.append((mark, _mean([b for b in bests if b is not None])))
        out[order] = points
    return out


def trajectory_markdown(curves: dict[str, list[tuple[int, float]]]) -> str:
    """The gap over training: whether a buffer order's distance to shuffled closes, holds or opens toward the cap."""
    orders = [o for o in curves if curves[o]]
    if not orders:
        return ""
    by_order = {o: dict(curves[o]) for o in orders}
    marks = sorted({e for o in orders for e in by_order[o]})
    others = [o for o in orders if o != "shuffled"] if "shuffled" in by_order else []
    lines = ["Best validation MRR so far, mean of the seeds, by epoch (the gap in points):", "",
             "| after epoch | " + " | ".join(orders) + "".join(f" | {o} - shuffled" for o in others) + " |",
             "|---" * (1 + len(orders) + len(others)) + "|"]
    for mark in marks:
        cells = [f"{by_order[o][mark]:.4f}" if mark in by_order[o] else "-" for o in orders]
        base = by_order["shuffled"].get(mark) if others else None
        gaps = [f"{100 * (by_order[o][mark] - base):+.1f}" if base is not None and mark in by_order[o] else "-"
                for o in others]
        lines.append(f"| {mark} | " + " | ".join(cells + gaps) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- datasets and runs

def _build(out: Path, command: Callable[[Path], list[str]]) -> None:
    """Run ``command(out.partial)`` and rename its output to ``out``, so an interrupted step is redone."""
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    sh(command(partial))
    partial.rename(out)


def prepare(name: str, work: Path, partitions: int, partitioner: str = "metis") -> Path:
    """``work/data/NAME-link-pP[-PARTITIONER]``: NAME imported for link prediction and prepared, each step skipped
    when done."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    suffix = "" if partitioner == "metis" else f"-{partitioner}"
    raw, out = data / f"{name}-link-raw", data / f"{name}-link-p{partitions}{suffix}"
    if not raw.exists():
        _build(raw, lambda to: [PY, "-m", "loader.cli", "-q", "import", str(SHARED / f"{name}.npz"), str(to),
                                "--format", "npz", "--task", "link"])
    if not out.exists():
        _build(out, lambda to: [PY, "-m", "loader.cli", "-q", "prepare", str(raw), str(to), "--partitions",
                                str(partitions), "--partitioner", partitioner, "--memory-budget", "2G"])
    return out


def shorter_run(name: str, order: str, seed: int, dirs: dict[str, Path],
                args: argparse.Namespace) -> tuple[str, bool] | None:
    """The same run at the largest smaller ``--max-epochs`` that a run at this cap can start from, as (its stem,
    whether it stopped early): one that stopped early is this run (early stopping does not depend on the cap); one
    that ran to its cap and kept its last checkpoint (``STEM.last.ckpt``) is this run's first epochs, which it
    continues from, bitwise, as from any checkpoint. None if there is neither."""
    for cap in range(args.max_epochs - 1, 0, -1):
        stem = run_stem(name, order, seed, argparse.Namespace(**{**vars(args), "max_epochs": cap}))
        try:
            if json.loads((dirs["runs"] / f"{stem}.json").read_text()).get("stopped_early") is True:
                return stem, True
        except (OSError, ValueError, AttributeError):
            pass
        if (dirs["runs"] / f"{stem}.last.ckpt").exists():
            return stem, False
    return None


def continue_shorter_run(stem: str, shorter: tuple[str, bool], runs: Path) -> None:
    """Start run ``stem`` from ``shorter`` (``shorter_run``): its launches, and its result where it stopped early
    (nothing left to train), else its last checkpoint as ``stem``'s checkpoint to resume."""
    other, stopped_early = shorter
    launches = runs / f"{other}.code.json"
    if launches.exists():
        shutil.copyfile(launches, runs / f"{stem}.code.json")
    if stopped_early:
        shutil.copyfile(runs / f"{other}.json", runs / f"{stem}.json")
        print(f"{stem}: the run at a smaller cap ({other}) stopped early: its result is this run's", flush=True)
    else:
        shutil.copyfile(runs / f"{other}.last.ckpt", runs / f"{stem}.ckpt")
        print(f"{stem}: continues {other} from its last checkpoint", flush=True)


def one_run(name: str, dataset: Path, order: str, seed: int, dirs: dict[str, Path],
            args: argparse.Namespace) -> LinkRun:
    stem = run_stem(name, order, seed, args)
    out, log = dirs["runs"] / f"{stem}.json", dirs["logs"] / f"{stem}.log"
    launches = dirs["runs"] / f"{stem}.code.json"
    checkpoint = dirs["runs"] / f"{stem}.ckpt"
    # a longer cap continues a shorter one's run rather than training its epochs again
    shorter = (shorter_run(name, order, seed, dirs, args)
               if args.reuse and order != "daemon" and not out.exists() and not checkpoint.exists() else None)
    if shorter is not None:
        continue_shorter_run(stem, shorter, dirs["runs"])
    if not (args.reuse and out.exists()):  # the json is written atomically when a run ends: a finished run
        out.unlink(missing_ok=True)
        socket = dirs["work"] / f"{stem}.sock"
        command = train_command(dataset, order, seed, out, args, socket)
        # an in-memory run checkpoints every epoch, so a run cut short (a session's end, a kill) resumes from its
        # last whole epoch under --reuse and ends as the uninterrupted run would (the trainer's resume is bitwise)
        if order != "daemon":
            command += ["--checkpoint", str(checkpoint)]
            if args.reuse and checkpoint.exists():
                command.append("--resume")
            else:
                checkpoint.unlink(missing_ok=True)
        with log.open("a" if "--resume" in command else "w") as sink, contextlib.ExitStack() as served:
            if order == "daemon":
                config = dirs["work"] / f"{stem}.toml"
                config.write_text(daemon_config(dataset, socket, seed, args))
                daemon = subprocess.Popen([PY, "-m", "loader.cli", "serve", "--config", str(config)], stdout=sink,
                                          stderr=subprocess.STDOUT)
                served.callback(stop_process, daemon, 30)
            sink.write("$ " + " ".join(command) + "\n")
            sink.flush()
            record_launch(launches, "--resume" in command)
            code = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT).returncode
        if code != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise SystemExit(f"bench: {stem}: exit {code}\n{tail}")
        if checkpoint.exists():  # kept for a longer cap to continue from (``shorter_run``)
            checkpoint.replace(dirs["runs"] / f"{stem}.last.ckpt")
    try:
        return read_run(order, seed, json.loads(out.read_text()), run_code(read_launches(launches)))
    except (ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"bench: {out}: {err}") from None


def write_outputs(stem: str, sections: list[str], payload: dict[str, object], args: argparse.Namespace) -> None:
    machine = machine_description()
    through = " and through the daemon" if "daemon" in args.orders else ""
    lr = args.lr or f"the trainer's default (shuffled {DEFAULT_LINK_LR}, buffer orders {DEFAULT_BUFFER_LR})"
    header = (f"# Link prediction: partition buffer orders vs shuffled (in memory{through})\n\n{machine}; "
              f"seeds {args.seeds}, "
              f"max {args.max_epochs} epochs, patience {args.patience} (validation MRR), {args.partitions} METIS "
              f"partitions, GraphSAGE hidden 128, MLP decoder, batch {args.batch_size}, fanouts {args.fanouts}, "
              f"lr {lr}, moving average {args.ema or 'off'}, device {args.device}; test scores at the best "
              f"validation epoch, each held-out positive ranked among its 100 fixed negative tails; "
              f"`bench/link_bench.py`.\n\n")
    (RESULTS / f"{stem}.md").write_text(header + "\n".join(sections))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (RESULTS / f"{stem}.json").write_text(json.dumps({"args": settings, "machine": machine, **payload}, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind: kill the trainer
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "link-" + "-".join(args.datasets) + (f"-{args.tag}" if args.tag else "")
    sections: list[str] = []
    graphs: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="mb-link-", dir=os.environ.get("TMPDIR")) as tmp:
        work = (args.work or Path(tmp)).resolve()
        dirs = {"work": work, "runs": work / "runs", "logs": work / "logs"}
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        for name in args.datasets:
            dataset = prepare(name, work, args.partitions, args.partitioner)
            runs: dict[str, list[LinkRun]] = {}
            buffer = f"buffer of C = {args.buffer_partitions} of {args.partitions} partitions"
            for order in args.orders:
                for seed in args.seeds:
                    started = time.monotonic()
                    run = one_run(name, dataset, order, seed, dirs, args)
                    runs.setdefault(order, []).append(run)
                    print(f"{name} {order} seed {seed}: test mrr {run.test['mrr']:.4f} hits@10 "
                          f"{run.test['hits@10']:.4f} auc {run.test['roc_auc']:.4f} at epoch {run.best_epoch} of "
                          f"{run.epochs_run}, {time.monotonic() - started:.0f} s", flush=True)
            target, summaries = summarize(runs)
            curves = trajectory(runs)
            sections.append(dataset_markdown(name, target, summaries, buffer) + "\n" + code_markdown(runs) + "\n"
                            + trajectory_markdown(curves))
            graphs[name] = {"target_val_mrr": target, "orders": [asdict(s) for s in summaries],
                            "best_val_mrr_by_epoch": curves,
                            "runs": {order: [asdict(r) for r in group] for order, group in runs.items()}}
            write_outputs(stem, sections, {"datasets": graphs}, args)  # after each graph: a cut run keeps its start
        print((RESULTS / f"{stem}.md").read_text())
    print(f"results: {RESULTS / (stem + '.md')}, {RESULTS / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
