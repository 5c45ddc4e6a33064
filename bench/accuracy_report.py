"""What bench/accuracy_bench.py reports, from its runs: accuracy, epochs to target, time to accuracy at scale, bars.

No runs here, only their results (``Run``), so the arithmetic is tested on its own
(tests/bench/test_accuracy_report.py). Per graph, the target is NS's mean best validation accuracy minus
1 point (``TARGET_MARGIN``); per mode:

- the final score at convergence: test accuracy at the best validation epoch, mean over seeds, and its
  difference to NS in points;
- epochs to target: the first epoch whose validation accuracy reaches the target, mean over the seeds
  that reach it, and that mean over NS's (``epochs_ratio``);
- time to accuracy at scale = epochs to target x the seconds of one epoch of that mode on
  bench/compare.py's graph (2M nodes by default), where the seconds of one epoch are
  ``epoch_batches / batches_per_s`` of the mode's row in compare.json (``read_compare``, ``time_at_scale``;
  loader-only, the first epoch). Rows: NS -> inmemory, every HB* -> the daemon's default mode (HB2 -> its
  ``-r2`` row), each exact-semantics mode -> its own (``compare_run``);
- the issue's bars it misses: epochs to target <= ``EPOCHS_BAR`` x NS's with every seed reaching it, test
  no more than ``POINTS_BAR`` below NS (``bars``).

The exact-semantics modes (``EXACT_MODES``) serve NS's batches bitwise
(tests/loader/daemon/fullgraph/test_fullgraph_modes.py): their runs may be NS's (``Run.reused_from``),
and then only their time at scale is their own.
"""

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXACT_MODES", "IN_MEMORY_MODES", "EPOCHS_BAR", "POINTS_BAR", "CURVE_EPOCHS", "TARGET_MARGIN", "EpochPoint",
           "Run",
           "ModeSummary", "BudgetGap", "DatasetReport", "ScaleEpoch", "CompareEpochs", "compare_run", "read_compare",
           "mean", "mean_reached", "epochs_ratio", "time_at_scale", "bars", "analyse", "dataset_markdown",
           "scale_markdown", "scale_header", "plot_curves"]

EXACT_MODES: dict[str, str] = {"EX": "exact", "STAGED": "staged", "HYBRID": "hybrid", "STATIC": "static",
                               "MMAP": "mmap"}
"""Bench modes whose batches are bitwise NS's, and the daemon's ``[loader] mode`` (and compare.py row) of each."""
IN_MEMORY_MODES = ("NS", "NS16", "NS8", "NSAGG")
"""The bench modes that train ``--mode inmemory`` (NS on another stored dtype or with the aggregation cache)."""
EPOCHS_BAR = 1.25
"""The largest epochs-to-target ratio to NS that passes (issue 28: no more than 1.25x NS's epochs)."""
POINTS_BAR = 1.0
"""The largest test-accuracy shortfall to NS, in points, that passes (issue 28: within 1 point)."""
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
    reused_from: str | None = None
    """The mode whose run this is (NS for an exact-semantics mode not trained: the same batches); None: its own."""

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
    reused_from: str | None
    """NS where this mode's runs are NS's (an exact-semantics mode not trained); None: trained itself."""
    epochs_vs_ns: float | None
    """Mean epochs to target over NS's, each over the seeds that reach it (None: either never, or no NS)."""
    scale_run: str | None
    """The row of compare.json that times this mode (None: no such mode there, e.g. FULL)."""
    scale_epoch_seconds: float | None
    """Seconds of one epoch of this mode on compare's graph (None: no file, no row, or no rate)."""
    scale_note: str
    """Why ``scale_epoch_seconds`` is None ("" where it is not)."""
    time_at_scale: float | None
    """Mean epochs to target x ``scale_epoch_seconds`` (None without either)."""
    missed_bars: list[str] | None
    """The issue's bars this mode misses ([]: none; None: NS itself, or no NS to compare with)."""


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


@dataclass(frozen=True)
class ScaleEpoch:
    """One row of bench/compare.py's results: what an epoch of that mode takes on compare's graph."""

    run: str
    """compare's row name (``hierarchical``, ``exact``, ``hierarchical-r2``, ...)."""
    batches_per_s: float | None
    """Loader-only batches/s of the first epoch (None: the row has none)."""
    epoch_batches: int | None
    """Training batches of one epoch over every rank (None: unknown)."""
    failed: str | None = None
    """How the run failed in compare (its daemon died: an OOM kill, a signal, an exit code; or the bench failed),
    None: it did not. A mode that fails in compare's configuration has no time at scale, whatever it measured
    before."""
    remark: str | None = None
    """What went wrong that leaves the measurement standing (a slow stop after it), None: nothing."""

    @property
    def seconds(self) -> float | None:
        """Seconds of one epoch at that rate: ``epoch_batches / batches_per_s`` (None: no rate, or it failed)."""
        if self.failed or not self.batches_per_s or not self.epoch_batches:
            return None
        return self.epoch_batches / self.batches_per_s if self.batches_per_s > 0 and self.epoch_batches > 0 else None

    @property
    def note(self) -> str:
        """Why ``seconds`` is None ("" where it is not)."""
        if self.failed:
            return f"{self.run} failed in compare: {self.failed}"
        return "" if self.seconds is not None else f"{self.run} has no rate in compare"


@dataclass(frozen=True)
class CompareEpochs:
    """A bench/compare.py results file, as far as time to accuracy at scale needs it."""

    path: str
    description: str
    """The graph, budget and batch it measured (for the report's header)."""
    batch_size: int | None
    """compare's ``--batch-size``: an epoch's batch count holds only for that batch size."""
    rows: dict[str, ScaleEpoch]
    """Every row, by compare's run name."""


def compare_run(mode: str, default_mode: str) -> str | None:
    """compare's row for bench mode ``mode``: NS -> ``inmemory``, the exact-semantics modes -> theirs, every
    HB* -> ``default_mode`` (the daemon mode HB's config leaves unset; ``-r2`` for the 2-rank HB2), FULL -> None.
    The HB variants differ in their fraction, grouping or static cache, and compare ran the mode with
    ``megabatch_fraction = "auto"``: with one pass an epoch reads every partition once whatever the fraction,
    so the rate carries over."""
    if mode in IN_MEMORY_MODES:  # compare ran float32 features without a cache: the rate is NS's
        return "inmemory"
    if mode in EXACT_MODES:
        return EXACT_MODES[mode]
    if mode == "HB2":
        return f"{default_mode}-r2"
    if mode == "HBAGG":  # compare --aggregation-cache's row; absent from a compare run without the cache
        return f"{default_mode}-agg"
    if mode.startswith("HB"):
        return default_mode
    return None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _failure(row: dict[str, object]) -> tuple[str | None, str | None]:
    """(how the run failed, a remark that leaves its measurement standing) from one row of compare.json. compare
    writes ``failure`` ("died: ...", "slow stop: ...", "bench failed: ..."); files written before it had ``died``,
    or only ``oom_kills`` and ``daemon_exit``, and a failure is read from those."""
    if "failure" in row:
        failure = row["failure"]
        if not failure:
            return None, None
        # the daemon served the whole measurement and was slow only to stop after it
        return (None, str(failure)) if str(failure).startswith("slow stop") else (str(failure), None)
    if row.get("died"):
        return str(row["died"]), None
    legacy = "; ".join(f"{key} {row[key]}" for key in ("oom_kills", "daemon_exit") if row.get(key))
    return legacy or None, None


def read_compare(path: Path) -> CompareEpochs:
    """The rows of ``path`` (bench/compare.py's ``compare.json``)."""
    data = json.loads(path.read_text())
    args = data.get("args", {})
    rows: dict[str, ScaleEpoch] = {}
    for row in data.get("results", []):
        run = str(row.get("mode"))
        rate, batches = _number(row.get("batches_per_s")), _number(row.get("epoch_batches"))
        failed, remark = _failure(row)
        rows[run] = ScaleEpoch(run, rate, None if batches is None else int(batches), failed, remark)
    nodes, budget, batch = args.get("nodes"), args.get("budget"), args.get("batch_size")
    description = (f"{nodes:,} nodes" if isinstance(nodes, int) else "? nodes") + \
        f", budget {budget}, batch {batch}, fanouts [{args.get('fanouts')}]; {data.get('machine', '?')}"
    return CompareEpochs(str(path), description, batch if isinstance(batch, int) else None, rows)


def mean_reached(epochs: Sequence[int | float | None]) -> float | None:
    """Mean over the seeds that reached the target (None: none did)."""
    reached = [e for e in epochs if e is not None]
    return statistics.fmean(reached) if reached else None


def epochs_ratio(mode_epochs: Sequence[int | None], ns_epochs: Sequence[int | None]) -> float | None:
    """Mean epochs to target of the mode over NS's, each over its seeds that reached it (None: either never)."""
    mode, ns = mean_reached(mode_epochs), mean_reached(ns_epochs)
    return None if mode is None or ns is None or ns <= 0 else mode / ns


def time_at_scale(epochs: float | None, epoch_seconds: float | None) -> float | None:
    """Time to accuracy at scale: epochs to target x seconds of one epoch on compare's graph (None without either)."""
    return None if epochs is None or epoch_seconds is None else epochs * epoch_seconds


def bars(mode_epochs: Sequence[int | None], ns_epochs: Sequence[int | None], vs_ns_points: float | None) -> list[str]:
    """The issue's bars this mode misses, in words ([]: it meets both). A seed that never reaches the target
    misses the epochs bar whatever the others' mean."""
    missed = []
    ratio = epochs_ratio(mode_epochs, ns_epochs)
    never = sum(e is None for e in mode_epochs)
    if never:
        missed.append(f"{never}/{len(mode_epochs)} seeds never reach the target")
    elif ratio is None:
        missed.append("no epochs ratio (NS never reaches the target)")
    elif ratio > EPOCHS_BAR:
        missed.append(f"epochs {ratio:.2f}x > {EPOCHS_BAR}x")
    if vs_ns_points is None:
        missed.append("no NS to compare")
    elif vs_ns_points < -POINTS_BAR:
        missed.append(f"test {vs_ns_points:+.2f} pt")
    return missed


# ---------------------------------------------------------------- analysis

def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values)


def scale_epoch(mode: str, scale: CompareEpochs | None, default_mode: str) -> tuple[str | None, float | None, str]:
    """(compare's row, its epoch seconds, why those are None) for ``mode``."""
    run = compare_run(mode, default_mode)
    if run is None:
        return None, None, "not a compare.py mode"
    if scale is None:
        return run, None, "no compare.json"
    row = scale.rows.get(run)
    if row is None:
        return run, None, f"no row {run}"
    return run, row.seconds, row.note


def summarize(mode: str, runs: list[Run], ns: list[Run] | None, target: float | None,
              scale: CompareEpochs | None, default_mode: str) -> ModeSummary:
    ns_mean = mean([r.best().test_acc for r in ns]) if ns else None
    ns_epochs = [r.epochs_to(target) for r in ns] if ns and target is not None else None
    epochs = [None if target is None else r.epochs_to(target) for r in runs]
    vs_ns = None if ns_mean is None else 100 * (mean([r.best().test_acc for r in runs]) - ns_mean)
    scale_run, epoch_seconds, scale_note = scale_epoch(mode, scale, default_mode)
    tests = [r.best().test_acc for r in runs]
    coverage = [c for r in runs for c in r.coverage]
    skew = [c for r in runs for c in r.skew]
    val_at: dict[int, float | None] = {}
    for epoch in CURVE_EPOCHS:
        values = [p.val_acc for r in runs for p in r.epochs if p.epoch == epoch]
        val_at[epoch] = mean(values) if values else None
    reused_from = runs[0].reused_from
    return ModeSummary(
        mode=mode, test_acc=tests, mean_test_acc=mean(tests), vs_ns_points=vs_ns,
        mean_best_epoch=mean([r.best().epoch for r in runs]), mean_epochs_run=mean([r.epochs[-1].epoch for r in runs]),
        # a reused run's seconds are NS's, not this mode's
        seconds_to_target=[None if target is None or reused_from else r.seconds_to(target) for r in runs],
        epochs_to_target=epochs,
        mean_coverage=mean(coverage) if coverage else None, mean_skew=mean(skew) if skew else None, val_at=val_at,
        reused_from=reused_from, epochs_vs_ns=None if ns_epochs is None else epochs_ratio(epochs, ns_epochs),
        scale_run=scale_run, scale_epoch_seconds=epoch_seconds, scale_note=scale_note,
        time_at_scale=time_at_scale(mean_reached(epochs), epoch_seconds),
        missed_bars=None if ns_epochs is None or mode == "NS" else bars(epochs, ns_epochs, vs_ns))


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


def analyse(name: str, runs: dict[str, list[Run]], min_budget: int, scale: CompareEpochs | None,
            default_mode: str) -> DatasetReport:
    """Summaries and gaps of one graph; the target is NS's mean best validation accuracy - 1 point. A reused
    mode's gap is NS's to itself: none is given. ``default_mode``: the daemon mode the HB* modes run."""
    ns = runs.get("NS")
    target = mean([r.best().val_acc for r in ns]) - TARGET_MARGIN if ns else None
    gaps = [worst_gap(m, r, ns, min_budget) for m, r in runs.items()
            if m != "NS" and not r[0].reused_from] if ns else []
    summaries = [summarize(m, r, ns, target, scale, default_mode) for m, r in runs.items()]
    return DatasetReport(name, target, summaries, gaps, runs)


# ---------------------------------------------------------------- reports

def _partial(values: Sequence[object]) -> str:
    reached = sum(v is not None for v in values)
    return "" if reached == len(values) else f" ({reached}/{len(values)} seeds)"


def _seconds(values: Sequence[float | None]) -> str:
    reached = mean_reached(values)
    return "never" if reached is None else f"{reached:.1f}{_partial(values)}"


def _optional(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _at_scale(s: ModeSummary) -> str:
    if s.time_at_scale is not None:
        return f"{s.time_at_scale:,.0f}{_partial(s.epochs_to_target)}"
    return "never" if s.scale_epoch_seconds is not None else "-"


def _bars(s: ModeSummary) -> str:
    if s.missed_bars is None:
        return "reference" if s.mode == "NS" else "-"
    return "yes" if not s.missed_bars else "no: " + "; ".join(s.missed_bars)


def dataset_markdown(report: DatasetReport, min_budget: int) -> str:
    target = report.target_val_acc
    lines = [f"## {report.name}", ""]
    if target is not None:
        lines += [f"Time to accuracy: until validation accuracy >= {target:.4f} "
                  f"(NS's mean best validation accuracy - 1 point).", ""]
    curve = " | ".join(f"val @{e}" for e in CURVE_EPOCHS)
    lines += ["| mode | test acc at best val (mean) | per seed | vs NS (pt) | best epoch (mean) | epochs run (mean) | "
              f"time to accuracy (s) | epochs to accuracy | epochs vs NS | time to accuracy at scale (s) | {curve} | "
              "neighbour coverage | label skew | meets the bars |",
              "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(CURVE_EPOCHS) + "---|---|---|"]
    for s in report.summaries:
        at = " | ".join(_optional(s.val_at[e], ".3f") for e in CURVE_EPOCHS)
        seconds = "- (NS's runs)" if s.reused_from else "-" if target is None else _seconds(s.seconds_to_target)
        lines.append(f"| {s.mode} | {s.mean_test_acc:.4f} | {', '.join(f'{a:.4f}' for a in s.test_acc)} | "
                     f"{_optional(s.vs_ns_points, '+.2f')} | {s.mean_best_epoch:.1f} | {s.mean_epochs_run:.1f} | "
                     f"{seconds} | {'-' if target is None else _seconds(s.epochs_to_target)} | "
                     f"{_optional(s.epochs_vs_ns, '.2f')}{'' if s.epochs_vs_ns is None else 'x'} | {_at_scale(s)} | "
                     f"{at} | {_optional(s.mean_coverage, '.3f')} | {_optional(s.mean_skew, '.3f')} | {_bars(s)} |")
    reused = [s.mode for s in report.summaries if s.reused_from]
    if reused:
        lines += ["", f"{', '.join(reused)}: NS's runs (the same batches, bitwise): NS's accuracy and epochs, not "
                  "trained here (--train-exact trains them); only the time at scale is their own."]
    unscaled = [f"{s.mode} ({s.scale_note})" for s in report.summaries if s.scale_epoch_seconds is None]
    if unscaled:
        lines += ["", f"No time at scale (\"-\") for {', '.join(unscaled)}."]
    if report.gaps:
        lines += ["", f"Worst gap over epoch budgets E >= {min_budget} (NS - mode, test accuracy at the best "
                  "validation epoch within 1..E, mean over seeds; positive = below NS):", ""]
        for gap in report.gaps:
            text = ("- (the shortest run is shorter)" if gap.gap_points is None
                    else f"{gap.gap_points:+.2f} pt at E = {gap.at_budget} (E = {gap.first}..{gap.last})")
            lines.append(f"- {gap.mode}: {text}")
    return "\n".join(lines) + "\n"


def scale_header(ratio: float | None, scale: CompareEpochs | None, compare_path: Path, batch_size: int) -> str:
    """The out-of-core paragraph of the report's header: the ratio, the formula, and where its epoch times come
    from (or that they do not)."""
    fraction = "the daemon's \"auto\" megabatch_fraction (no feature ratio)" if ratio is None else \
        f"feature ratio R = {ratio:g}: megabatch_fraction = 1/R = {1 / ratio:.4g} in every hierarchical mode " \
        "that sets none"
    text = (f"Out of core: {fraction}. Time to accuracy at scale = epochs to target (mean over the seeds that "
            "reach it) x epoch seconds of that mode on bench/compare.py's graph, epoch seconds = epoch_batches / "
            "batches_per_s of its row in compare.json (loader-only, first epoch; NS -> inmemory, HB* -> the "
            "daemon's default mode, EX -> exact, STAGED -> staged, HYBRID -> hybrid, STATIC -> static, MMAP -> "
            "mmap). ")
    if scale is None:
        return text + f"{compare_path} is absent: no time at scale (\"-\"); run bench/compare.py first.\n"
    text += f"Epoch times from {scale.path}: {scale.description}."
    remarks = [f"{row.run} ({row.remark}; its rate is used)" for row in scale.rows.values() if row.remark]
    if remarks:
        text += f" Noted there: {', '.join(remarks)}."
    if scale.batch_size is not None and scale.batch_size != batch_size:
        text += (f" Its batch ({scale.batch_size}) is not this bench's ({batch_size}): its epochs hold another "
                 "number of batches.")
    return text + "\n"


def scale_markdown(reports: Sequence[DatasetReport]) -> str:
    """One table of every graph and mode against the issue's bars (NS's row first in each graph: the reference)."""
    lines = ["## Against the bars (every graph)", "",
             f"Bars: epochs to target <= {EPOCHS_BAR}x NS's (every seed reaching it); test at convergence at most "
             f"{POINTS_BAR:g} point below NS's (mean of seeds).", "",
             "| graph | mode | epochs to target | vs NS | test (mean) | vs NS (pt) | epoch at scale (s) | "
             "time to accuracy at scale (s) | meets the bars |",
             "|---|---|---|---|---|---|---|---|---|"]
    for report in reports:
        for s in report.summaries:
            epochs = "-" if report.target_val_acc is None else _seconds(s.epochs_to_target)
            lines.append(f"| {report.name} | {s.mode} | {epochs} | {_optional(s.epochs_vs_ns, '.2f')}"
                         f"{'' if s.epochs_vs_ns is None else 'x'} | {s.mean_test_acc:.4f} | "
                         f"{_optional(s.vs_ns_points, '+.2f')} | {_optional(s.scale_epoch_seconds, ',.1f')} | "
                         f"{_at_scale(s)} | {_bars(s)} |")
    return "\n".join(lines) + "\n"


def plot_curves(report: DatasetReport, path: Path) -> bool:
    """Validation accuracy per epoch (mean over seeds), one line per trained mode; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.5))
    reused = [mode for mode, runs in report.runs.items() if runs[0].reused_from]
    for mode, runs in report.runs.items():
        if runs[0].reused_from:  # NS's very line
            continue
        label = f"NS (= {', '.join(reused)})" if mode == "NS" and reused else mode
        # a trained exact-semantics mode samples NS's very batches: dashed, so that NS stays visible beneath it
        ax.plot(*val_curve(runs), label=label, linewidth=1.4, linestyle="--" if mode in EXACT_MODES else "-")
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

