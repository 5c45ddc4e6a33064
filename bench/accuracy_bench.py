"""Accuracy to convergence: the daemon's batches vs in-memory neighbour sampling vs the full graph.

Every shared graph (../shared/data: cora-planetoid, citeseer-planetoid, amazon-photo, coauthor-cs,
coauthor-physics) is imported with a seeded stratified 60/20/20 split (a file's published split is
kept: the Planetoid graphs) and prepared with METIS into ``--partitions`` partitions, once per
``--work`` directory. Then, per mode and seed (model seed = sampler seed), 2-layer GraphSAGE
(hidden 256, dropout 0.5, Adam lr 0.003, fanouts 10,5 for training and evaluation, batch 1024)
trains for up to ``--max-epochs`` epochs with early stopping on validation accuracy (``--patience``):

    NS    megabatch train --mode inmemory: the in-memory neighbour-sampling reference
    HB    through the daemon with its default settings (the config sets only [dataset] path,
          [sampler] seed/batch/fanouts, [server] socket and [metrics] port = 0)
    HB25  the same plus [hierarchy] megabatch_fraction = 0.25
    EX    the same plus [loader] mode = "exact" (full-graph sampling, Ginex)
    HB25r, HB25s, HB50 (not run by default; the remedy study): HB25 with schedule = "random" (the
          grouping before the balanced one), HB25 without the static cache, megabatch_fraction = 0.5
    HB2   (not run by default) HB trained by 2 DDP ranks (--nproc-per-node 2, gloo) through the one
          daemon, each rank taking half the batch (global batch = --batch-size, as for HB), with
          [memory] budget = "3G": the second rank's slots come on top of the default 2G, so the
          mega-batches are HB's (at 2G the slots of 2 clients would shrink them)
    FULL  full-batch GraphSAGE on the whole graph (bench/fullgraph_reference.py; no sampling,
          evaluation with every neighbour)

Reported per graph (bench/results/accuracy-<names>.{json,md}, accuracy-<graph>.png):
  - test accuracy at the best validation epoch (first epoch of the highest validation accuracy),
    mean and per seed, and its difference to NS in points; mean best epoch and epochs run;
  - time to accuracy: cumulative train_s + eval_s until validation accuracy first reaches NS's mean
    best validation accuracy minus 1 point, mean over the seeds that reach it ("never" if none);
  - the mean "neighbour coverage" the daemon logs once per epoch ("-" where it logs none);
  - the worst gap over epoch budgets: for each E from ``--min-budget`` (10) to the shortest run of the
    pair, each run's test accuracy at its best validation epoch among epochs 1..E, mean over seeds;
    the largest NS - mode (points; positive = the mode below NS) and its E;
  - validation accuracy per epoch, mean over the seeds still running, one line per mode (needs
    matplotlib, the ``bench`` extra; skipped with a note without it).

The commands of one run (TRAIN = --model sage --hidden 256 --dropout 0.5 --lr 0.003 --epochs MAX
--patience P --seed S --json-out OUT --no-progress -q):

    NS:   python -m trainer --mode inmemory --dataset DS --batch-size 1024 --fanouts 10,5
              --eval-fanouts 10,5 --eval-batch-size 1024 --sampler-seed S TRAIN
    HB*, EX: python -m loader.cli --no-progress serve --config WORK/runs/NAME-MODE-seedS.toml
              (output to WORK/logs/NAME-MODE-seedS.daemon.log; without -q, which would hide the
              INFO lines that carry the coverage), then
          python -m trainer --socket SOCK --connect-timeout 60 TRAIN; the daemon gets SIGTERM after.
    FULL: python bench/fullgraph_reference.py DS --seed S --max-epochs MAX --patience P --json-out OUT

Usage (a full run takes hours on 2 cores; keep --work to rerun without importing and preparing):

    .venv/bin/python bench/accuracy_bench.py [--work /var/tmp/mb-acc]
    .venv/bin/python bench/accuracy_bench.py --datasets amazon-photo --modes NS,HB,HB25 --work /var/tmp/mb-acc
    .venv/bin/python bench/accuracy_bench.py --datasets cora-planetoid --seeds 0 --max-epochs 3 --patience 2
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import machine_description, sh, stop_process, wait_for_socket

__all__ = ["DATASETS", "MODES", "EpochPoint", "Run", "ModeSummary", "BudgetGap", "DatasetReport", "main"]

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SHARED = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "bench" / "results"
DATASETS = ("cora-planetoid", "citeseer-planetoid", "amazon-photo", "coauthor-cs", "coauthor-physics")
MODES = ("NS", "HB", "HB25", "EX", "FULL", "HB25r", "HB25s", "HB50", "HB2")
DEFAULT_MODES = ("NS", "HB", "HB25", "EX", "FULL")
DAEMON_EXTRA = {"HB": "", "HB25": "[hierarchy]\nmegabatch_fraction = 0.25\n", "EX": '[loader]\nmode = "exact"\n',
                # the remedy study (docs/PERFORMANCE.md): the old default grouping, no static cache, a half
                "HB25r": '[hierarchy]\nmegabatch_fraction = 0.25\nschedule = "random"\n',
                "HB25s": "[hierarchy]\nmegabatch_fraction = 0.25\nstatic_cache = false\n",
                "HB50": "[hierarchy]\nmegabatch_fraction = 0.5\n", "HB2": '[memory]\nbudget = "3G"\n'}
"""What each daemon mode adds to the default config."""
RANKS = {"HB2": 2}
"""Daemon modes trained by several DDP ranks (the others: one trainer)."""
COVERAGE = re.compile(r"neighbour coverage ([0-9.]+)")
SKEW = re.compile(r"neighbour coverage [0-9.]+, label skew ([0-9.]+)")
CURVE_EPOCHS = (5, 10, 20)
"""Epochs whose mean validation accuracy the table shows (how fast a mode converges)."""
TARGET_MARGIN = 0.01
"""Time to accuracy counts until validation accuracy reaches NS's mean best minus this (1 point)."""


@dataclass(frozen=True)
class EpochPoint:
    """One evaluated epoch: accuracies, loss and its wall seconds (train_s + eval_s)."""

    epoch: int
    val_acc: float
    test_acc: float
    loss: float
    seconds: float


@dataclass(frozen=True)
class Run:
    """One (dataset, mode, seed) training run, read back from its JSON and logs."""

    dataset: str
    mode: str
    seed: int
    epochs: list[EpochPoint]
    stopped_early: bool
    wall_seconds: float
    coverage: list[float]
    """Every "neighbour coverage" value the daemon logged (empty without a daemon or such lines)."""
    skew: list[float]
    """Every "label skew" value the daemon logged."""

    def best(self, budget: int | None = None) -> EpochPoint:
        """The first epoch of the highest validation accuracy among epochs 1..budget (default all)."""
        points = [p for p in self.epochs if budget is None or p.epoch <= budget]
        return max(points, key=lambda p: (p.val_acc, -p.epoch))

    def epochs_to(self, target: float) -> int | None:
        """The first epoch whose validation accuracy reaches ``target`` (None: never); unlike seconds, it does
        not depend on what else shared the machine."""
        return next((p.epoch for p in self.epochs if p.val_acc >= target), None)

    def seconds_to(self, target: float) -> float | None:
        """Cumulative seconds until validation accuracy first reaches ``target`` (None: never)."""
        total = 0.0
        for point in self.epochs:
            total += point.seconds
            if point.val_acc >= target:
                return total
        return None


@dataclass(frozen=True)
class ModeSummary:
    """One mode on one dataset, over its seeds."""

    mode: str
    test_acc: list[float]
    mean_test_acc: float
    vs_ns_points: float | None
    mean_best_epoch: float
    mean_epochs_run: float
    seconds_to_target: list[float | None]
    epochs_to_target: list[int | None]
    mean_coverage: float | None
    mean_skew: float | None
    val_at: dict[int, float | None]
    """Mean validation accuracy at each of CURVE_EPOCHS over the seeds that evaluated it."""


@dataclass(frozen=True)
class BudgetGap:
    """The largest NS - mode test-accuracy gap (points) over epoch budgets ``first``..``last``."""

    mode: str
    first: int
    last: int
    gap_points: float | None
    at_budget: int | None


@dataclass(frozen=True)
class DatasetReport:
    """Everything reported for one graph: the time-to-accuracy target (None without NS), one summary
    per mode, one budget gap per mode other than NS (none without NS), and the runs themselves."""

    name: str
    target_val_acc: float | None
    summaries: list[ModeSummary]
    gaps: list[BudgetGap]
    runs: dict[str, list[Run]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated (default: all five)")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"comma-separated subset of {','.join(MODES)} (default {','.join(DEFAULT_MODES)})")
    parser.add_argument("--reuse", action="store_true",
                        help="read runs whose result is already in --work instead of rerunning them (an "
                        "interrupted bench resumes; wall seconds of reused runs are unknown)")
    parser.add_argument("--tag", default="", help="appended to the result files' names (keeps other studies' results)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-epochs", type=int, default=200)
    parser.add_argument("--patience", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--partitioner", choices=("metis", "stream", "random"), default="metis",
                        help="prepare's partitioner (default metis; random isolates label skew from the cut)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanouts", default="10,5")
    parser.add_argument("--min-budget", type=int, default=10, help="smallest epoch budget E of the gap (default 10)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--work", type=Path, help="prepared datasets, run outputs and logs (default: a temp dir); "
                        "datasets already there are reused")
    args = parser.parse_args(argv)
    args.datasets = args.datasets.split(",")
    args.modes = args.modes.split(",")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)} (choose from {', '.join(MODES)})")
    return args


# ---------------------------------------------------------------- datasets and runs

def _build(out: Path, command: Callable[[Path], list[str]]) -> None:
    """Run ``command(out.partial)`` and rename its output to ``out``, so an interrupted step is redone."""
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    sh(command(partial))
    partial.rename(out)


def prepare(name: str, work: Path, partitions: int, partitioner: str = "metis") -> Path:
    """``work/data/NAME-pP[-PARTITIONER]``: NAME imported and prepared, each step skipped when already done."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    suffix = "" if partitioner == "metis" else f"-{partitioner}"
    raw, out = data / f"{name}-raw", data / f"{name}-p{partitions}{suffix}"
    if not raw.exists():
        _build(raw, lambda to: [PY, "-m", "loader.cli", "-q", "import", str(SHARED / f"{name}.npz"), str(to),
                                "--format", "npz", "--split", "0.6,0.2,0.2", "--split-seed", "0"])
    if not out.exists():
        _build(out, lambda to: [PY, "-m", "loader.cli", "-q", "prepare", str(raw), str(to), "--partitions",
                                str(partitions), "--partitioner", partitioner, "--memory-budget", "2G"])
    return out


def daemon_config(mode: str, dataset: Path, sock: Path, seed: int, args: argparse.Namespace) -> str:
    """The TOML of a daemon run: defaults, plus what ``mode`` changes (``DAEMON_EXTRA``)."""
    fanouts = ", ".join(args.fanouts.split(","))
    ranks = RANKS.get(mode, 1)
    # several ranks: the same global batch, and a session for each rank
    clients = f"max_clients = {ranks}\n" if ranks > 1 else ""
    return (f'[dataset]\npath = "{dataset}"\n'
            f"[sampler]\nbatch_size = {args.batch_size // ranks}\nfanouts = [{fanouts}]\n"
            f"eval_fanouts = [{fanouts}]\neval_batch_size = {args.batch_size}\nseed = {seed}\n"
            f'[server]\nsocket = "{sock}"\n{clients}[metrics]\nport = 0\n' + DAEMON_EXTRA[mode])


def train_flags(seed: int, out: Path, args: argparse.Namespace) -> list[str]:
    return ["--model", "sage", "--hidden", "256", "--dropout", "0.5", "--lr", "0.003", "--epochs",
            str(args.max_epochs), "--patience", str(args.patience), "--seed", str(seed), "--device", args.device,
            "--json-out", str(out), "--no-progress", "-q"]


def run_logged(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` with its output appended to ``log``; on failure show the log's tail and stop."""
    with log.open("a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        fail(f"exit {code}: {' '.join(cmd)}", log)


def fail(message: str, *logs: Path) -> None:
    for log in logs:
        if log.exists():
            print(f"--- last lines of {log}", file=sys.stderr)
            print("\n".join(log.read_text(errors="replace").splitlines()[-30:]), file=sys.stderr)
    raise SystemExit(f"bench: {message}")


@contextmanager
def daemon(config: Path, sock: Path, log: Path) -> Iterator[None]:
    """A ``serve`` process for the body's duration (stderr into ``log``); SIGTERM and wait after."""
    sock.unlink(missing_ok=True)
    with log.open("w") as err:
        process = subprocess.Popen([PY, "-m", "loader.cli", "--no-progress", "serve", "--config", str(config)],
                                   stdout=err, stderr=subprocess.STDOUT)
    try:
        try:
            wait_for_socket(sock, process, timeout=600)
        except SystemExit as exc:
            fail(str(exc).removeprefix("bench: "), log)
        yield
    finally:
        stop_process(process, 60)


def one_run(name: str, dataset: Path, mode: str, seed: int, dirs: dict[str, Path], args: argparse.Namespace) -> Run:
    """Train once in ``mode`` and read the result back."""
    stem = f"{name}-{mode}-seed{seed}"
    out = dirs["runs"] / f"{stem}.json"
    trainer_log, daemon_log = dirs["logs"] / f"{stem}.trainer.log", dirs["logs"] / f"{stem}.daemon.log"
    if args.reuse and out.exists():  # the json is written atomically once a run ends: a finished run
        return read_run(name, mode, seed, out, daemon_log if mode in DAEMON_EXTRA else None, float("nan"))
    out.unlink(missing_ok=True)
    trainer_log.unlink(missing_ok=True)
    started = time.monotonic()
    if mode == "NS":
        run_logged([PY, "-m", "trainer", "--mode", "inmemory", "--dataset", str(dataset), "--batch-size",
                    str(args.batch_size), "--fanouts", args.fanouts, "--eval-fanouts", args.fanouts,
                    "--eval-batch-size", str(args.batch_size), "--sampler-seed", str(seed),
                    *train_flags(seed, out, args)], trainer_log)
    elif mode == "FULL":
        run_logged([PY, str(ROOT / "bench" / "fullgraph_reference.py"), str(dataset), "--seed", str(seed),
                    "--max-epochs", str(args.max_epochs), "--patience", str(args.patience), "--layers",
                    str(len(args.fanouts.split(","))), "--device", args.device, "--json-out", str(out)], trainer_log)
    else:
        sock, config = dirs["sockets"] / f"{mode}.sock", dirs["runs"] / f"{stem}.toml"
        config.write_text(daemon_config(mode, dataset, sock, seed, args))
        with daemon(config, sock, daemon_log):
            try:
                ranks = ["--nproc-per-node", str(RANKS[mode])] if mode in RANKS else []
                run_logged([PY, "-m", "trainer", "--socket", str(sock), "--connect-timeout", "60", *ranks,
                            *train_flags(seed, out, args)], trainer_log)
            except SystemExit:
                fail(f"{stem}: the trainer failed (its log and the daemon's above)", daemon_log)
    return read_run(name, mode, seed, out, daemon_log if mode in DAEMON_EXTRA else None,
                    time.monotonic() - started)


def read_run(name: str, mode: str, seed: int, out: Path, daemon_log: Path | None, wall: float) -> Run:
    """A ``Run`` from the trainer's ``--json-out`` (evaluated epochs only) and the daemon's log."""
    data = json.loads(out.read_text())
    points = [EpochPoint(int(e["epoch"]), float(e["val_acc"]), float(e["test_acc"]), float(e["loss"]),
                         float(e["train_s"]) + float(e["eval_s"]))
              for e in data["epochs"] if e.get("val_acc") is not None]
    if not points:
        raise SystemExit(f"bench: {out}: no evaluated epoch")
    return Run(name, mode, seed, points, bool(data.get("stopped_early")), wall, parse_values(daemon_log, COVERAGE),
               parse_values(daemon_log, SKEW))


def parse_values(log: Path | None, pattern: re.Pattern[str]) -> list[float]:
    """Every value ``pattern`` captures in the daemon's log, in order."""
    if log is None or not log.exists():
        return []
    return [float(m.group(1)) for m in pattern.finditer(log.read_text(errors="replace"))]


# ---------------------------------------------------------------- analysis

def mean(values: list[float]) -> float:
    return statistics.fmean(values)


def summarize(mode: str, runs: list[Run], ns_mean: float | None, target: float | None) -> ModeSummary:
    tests = [r.best().test_acc for r in runs]
    coverage = [c for r in runs for c in r.coverage]
    skew = [c for r in runs for c in r.skew]
    val_at: dict[int, float | None] = {}
    for epoch in CURVE_EPOCHS:
        values = [p.val_acc for r in runs for p in r.epochs if p.epoch == epoch]
        val_at[epoch] = mean(values) if values else None
    return ModeSummary(
        mode=mode, test_acc=tests, mean_test_acc=mean(tests),
        vs_ns_points=None if ns_mean is None else 100 * (mean(tests) - ns_mean),
        mean_best_epoch=mean([r.best().epoch for r in runs]), mean_epochs_run=mean([r.epochs[-1].epoch for r in runs]),
        seconds_to_target=[None if target is None else r.seconds_to(target) for r in runs],
        epochs_to_target=[None if target is None else r.epochs_to(target) for r in runs],
        mean_coverage=mean(coverage) if coverage else None, mean_skew=mean(skew) if skew else None, val_at=val_at)


def worst_gap(mode: str, runs: list[Run], ns: list[Run], min_budget: int) -> BudgetGap:
    """Largest mean(NS) - mean(mode) test accuracy at the best validation epoch within 1..E, over E
    from ``min_budget`` to the shortest run of either mode."""
    last = min(r.epochs[-1].epoch for r in [*runs, *ns])
    gaps = [(100 * (mean([r.best(e).test_acc for r in ns]) - mean([r.best(e).test_acc for r in runs])), e)
            for e in range(min_budget, last + 1)]
    if not gaps:
        return BudgetGap(mode, min_budget, last, None, None)
    gap, at = max(gaps)
    return BudgetGap(mode, min_budget, last, gap, at)


def val_curve(runs: list[Run]) -> tuple[list[int], list[float]]:
    """Mean validation accuracy per epoch over the runs that reached that epoch."""
    by_epoch: dict[int, list[float]] = {}
    for run in runs:
        for point in run.epochs:
            by_epoch.setdefault(point.epoch, []).append(point.val_acc)
    epochs = sorted(by_epoch)
    return epochs, [mean(by_epoch[e]) for e in epochs]


def analyse(name: str, runs: dict[str, list[Run]], min_budget: int) -> DatasetReport:
    """Summaries and gaps of one graph; the target is NS's mean best validation accuracy - 1 point."""
    ns = runs.get("NS")
    ns_mean = mean([r.best().test_acc for r in ns]) if ns else None
    target = mean([r.best().val_acc for r in ns]) - TARGET_MARGIN if ns else None
    gaps = [worst_gap(m, r, ns, min_budget) for m, r in runs.items() if m != "NS"] if ns else []
    return DatasetReport(name, target, [summarize(m, r, ns_mean, target) for m, r in runs.items()], gaps, runs)


# ---------------------------------------------------------------- reports

def _seconds(values: list[float | None] | list[int | None]) -> str:
    reached = [v for v in values if v is not None]
    if not reached:
        return "never"
    note = "" if len(reached) == len(values) else f" ({len(reached)}/{len(values)} seeds)"
    return f"{mean(reached):.1f}{note}"


def _optional(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def dataset_markdown(report: DatasetReport, min_budget: int) -> str:
    target = report.target_val_acc
    lines = [f"## {report.name}", ""]
    if target is not None:
        lines += [f"Time to accuracy: until validation accuracy >= {target:.4f} "
                  f"(NS's mean best validation accuracy - 1 point).", ""]
    curve = " | ".join(f"val @{e}" for e in CURVE_EPOCHS)
    lines += ["| mode | test acc at best val (mean) | per seed | vs NS (pt) | best epoch (mean) | epochs run (mean) | "
              f"time to accuracy (s) | epochs to accuracy | {curve} | neighbour coverage | label skew |",
              "|---|---|---|---|---|---|---|---|" + "---|" * len(CURVE_EPOCHS) + "---|---|"]
    for s in report.summaries:
        at = " | ".join(_optional(s.val_at[e], ".3f") for e in CURVE_EPOCHS)
        lines.append(f"| {s.mode} | {s.mean_test_acc:.4f} | {', '.join(f'{a:.4f}' for a in s.test_acc)} | "
                     f"{_optional(s.vs_ns_points, '+.2f')} | {s.mean_best_epoch:.1f} | {s.mean_epochs_run:.1f} | "
                     f"{'-' if target is None else _seconds(s.seconds_to_target)} | "
                     f"{'-' if target is None else _seconds(s.epochs_to_target)} | {at} | "
                     f"{_optional(s.mean_coverage, '.3f')} | {_optional(s.mean_skew, '.3f')} |")
    if report.gaps:
        lines += ["", f"Worst gap over epoch budgets E >= {min_budget} (NS - mode, test accuracy at the best "
                  "validation epoch within 1..E, mean over seeds; positive = below NS):", ""]
        for gap in report.gaps:
            text = ("- (the shortest run is shorter)" if gap.gap_points is None
                    else f"{gap.gap_points:+.2f} pt at E = {gap.at_budget} (E = {gap.first}..{gap.last})")
            lines.append(f"- {gap.mode}: {text}")
    return "\n".join(lines) + "\n"


def plot_curves(report: DatasetReport, path: Path) -> bool:
    """Validation accuracy per epoch (mean over seeds), one line per mode; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, runs in report.runs.items():
        # EX samples NS's very batches: dashed, so that NS stays visible beneath it
        ax.plot(*val_curve(runs), label=mode, linewidth=1.4, linestyle="--" if mode == "EX" else "-")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if report.target_val_acc is not None:
        ax.axhline(report.target_val_acc, color="grey", linestyle="--", linewidth=0.8, label="NS best val - 1 pt")
    ax.set(title=f"{report.name}: validation accuracy (mean over seeds)", xlabel="epoch",
           ylabel="validation accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(stem: str, reports: list[DatasetReport], args: argparse.Namespace) -> None:
    """``RESULTS/STEM.{json,md}`` with every graph finished so far."""
    machine = machine_description()
    header = (f"# Accuracy to convergence\n\n{machine}; seeds {args.seeds}, max {args.max_epochs} epochs, "
              f"patience {args.patience}, {args.partitions} {args.partitioner} partitions, fanouts {args.fanouts}, "
              f"batch {args.batch_size}, device {args.device}; `bench/accuracy_bench.py`.\n\n")
    (RESULTS / f"{stem}.md").write_text(header + "\n".join(dataset_markdown(r, args.min_budget) for r in reports))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    data = {"args": settings, "machine": machine, "datasets": {r.name: asdict(r) for r in reports}}
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=2))


def run_dataset(name: str, dirs: dict[str, Path], args: argparse.Namespace) -> dict[str, list[Run]]:
    dataset = prepare(name, dirs["work"], args.partitions, args.partitioner)
    runs: dict[str, list[Run]] = {}
    for mode in args.modes:
        for seed in args.seeds:
            run = one_run(name, dataset, mode, seed, dirs, args)
            runs.setdefault(mode, []).append(run)
            best = run.best()
            coverage = f", coverage {mean(run.coverage):.3f}" if run.coverage else ""
            print(f"{name} {mode} seed {seed}: test {best.test_acc:.4f} at best val {best.val_acc:.4f} (epoch "
                  f"{best.epoch} of {run.epochs[-1].epoch}{', stopped early' if run.stopped_early else ''}), "
                  f"{run.wall_seconds:.0f} s{coverage}", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: subprocess.run kills the trainer and ``daemon`` stops its daemon on the way
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    RESULTS.mkdir(parents=True, exist_ok=True)
    # one file per dataset set (and tag), so runs of other sets are kept
    stem = "accuracy-" + "-".join(args.datasets) + (f"-{args.tag}" if args.tag else "")
    reports: list[DatasetReport] = []
    with (tempfile.TemporaryDirectory(prefix="mb-acc-", dir=os.environ.get("TMPDIR")) as tmp,
          tempfile.TemporaryDirectory(prefix="mb-sock-", dir="/tmp") as sockets):  # short path: sun_path <= 107 B
        work = (args.work or Path(tmp)).resolve()
        dirs = {"work": work, "runs": work / "runs", "logs": work / "logs", "sockets": Path(sockets)}
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        for name in args.datasets:
            reports.append(analyse(name, run_dataset(name, dirs, args), args.min_budget))
            write_outputs(stem, reports, args)
            if not plot_curves(reports[-1], RESULTS / f"accuracy-{name}{f'-{args.tag}' if args.tag else ''}.png"):
                print("bench: matplotlib not importable (pip install -e '.[bench]'); no accuracy curve", flush=True)
        print((RESULTS / f"{stem}.md").read_text())
    print(f"results: {RESULTS / (stem + '.md')}, {RESULTS / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
