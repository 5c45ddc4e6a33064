"""Accuracy to convergence: the daemon's batches vs in-memory neighbour sampling vs the full graph, out of core.

Every shared graph (../shared/data: cora-planetoid, citeseer-planetoid, amazon-photo, coauthor-cs,
coauthor-physics) is imported with a seeded stratified 60/20/20 split (a file's published split is
kept: the Planetoid graphs) and prepared with METIS into ``--partitions`` partitions, once per
``--work`` directory. Then, per mode and seed (model seed = sampler seed), 2-layer GraphSAGE
(hidden 256, dropout 0.5, Adam lr 0.003, fanouts 10,5 for training and evaluation, batch 1024)
trains for up to ``--max-epochs`` epochs with early stopping on validation accuracy (``--patience``).

Out of core (``--feature-ratio R``, default 4): every hierarchical daemon mode that sets no fraction of
its own runs with ``[hierarchy] megabatch_fraction = 1/R``, so the features are R times what a mega-batch
holds; ``--feature-ratio auto`` leaves the daemon's "auto" (on every shared graph but coauthor-physics the
2G default budget then holds the whole graph, and HB is in-memory sampling in another order).

    NS    megabatch train --mode inmemory: the in-memory neighbour-sampling reference
    HB    through the daemon with its default settings at ratio R (the config sets only [dataset] path,
          [sampler] seed/batch/fanouts, [server] socket, [metrics] port = 0 and the fraction of R)
    HB25  the same with [hierarchy] megabatch_fraction = 0.25 whatever R
    EX, STAGED, HYBRID, STATIC, MMAP: the exact-semantics modes ([loader] mode = exact, staged, hybrid,
          static, mmap, at the same default budget). They serve NS's batches bitwise
          (tests/loader/daemon/fullgraph/test_fullgraph_modes.py), so by default they are not trained:
          their runs are NS's (accuracy, epochs; "NS's curve" in the tables, no wall seconds of their own)
          and only their time to accuracy at scale is theirs. ``--train-exact`` trains them through the
          daemon instead (what EX always did before), which checks the claim at the price of the runs.
    HB25r, HB25s, HB50 (not run by default; the remedy study): HB25 with schedule = "random" (the
          grouping before the balanced one), HB25 without the static cache, megabatch_fraction = 0.5
    NS16, HB16 (not run by default; the float16 remedy): NS and HB on a copy of the graph prepared with
          ``--feat-dtype float16``. HB16's mega-batch holds twice the partitions at the same bytes: its fraction
          is 2/R (the features are still R times what a mega-batch holds, in bytes); NS16 is float16's own
          accuracy cost, and HB16 is judged against NS (float32), as a user switching would be
    NS8, HB8 (not run by default; the 8-bit codes remedy): the same with ``--feat-dtype uint8`` (per-column codes, a
          quarter of float32's bytes): HB8's fraction is 4/R (at R = 4 the whole graph)
    NSAGG (not run by default; issue 32) NS with BatchGNN's aggregation cache (``megabatch aggregate --kind mean``
          once per prepared graph, then ``--aggregation-cache``): one hop fewer sampled, the first layer over
          every neighbour's mean
    HBW   (not run by default; issue 28's label-prior remedy) HB with ``[hierarchy] label_prior_loss``: each seed's
          loss weighed by its class's epoch share over its mega-batch's
    HBC   (not run by default; issue 28's COMET-style remedy) HB with ``[hierarchy] formation = "comet"``: a buffer
          of logical partitions, one swapped at a time, each training node in a random state that holds it
    HBAGG (not run by default; issue 32) HB with the daemon serving that cache (``[sampler] aggregation_cache``),
          at the fraction of ``--feature-ratio``
    HB2   (not run by default) HB trained by 2 DDP ranks (--nproc-per-node 2, gloo) through the one
          daemon, each rank taking half the batch (global batch = --batch-size, as for HB), with
          [memory] budget = "3G": the second rank's slots come on top of the default 2G, so the
          mega-batches are HB's (at 2G the slots of 2 clients would shrink them)
    FULL  full-batch GraphSAGE on the whole graph (bench/fullgraph_reference.py; no sampling,
          evaluation with every neighbour)

Reported per graph (bench/results/accuracy-<names>.{json,md}, accuracy-<graph>.png):
  - test accuracy at the best validation epoch (first epoch of the highest validation accuracy; the
    final score at convergence, since training stops ``--patience`` epochs after it), mean and per seed,
    and its difference to NS in points; mean best epoch and epochs run;
  - epochs and wall time to accuracy: the first epoch, and the cumulative train_s + eval_s until then, whose
    validation accuracy reaches NS's mean best validation accuracy minus 1 point, mean over the seeds that
    reach it ("never" if none); the epochs over NS's (the issue's bar: <= 1.25x);
  - time to accuracy at scale = epochs to target x epoch seconds of that mode on bench/compare.py's
    graph (2M nodes by default), where epoch seconds = epoch_batches / batches_per_s of the mode's row in
    ``--compare-json`` (default bench/results/compare.json: loader-only, first epoch). Rows: NS ->
    inmemory, every HB* -> the daemon's default mode (hierarchical; HB2 -> its -r2 row), EX -> exact,
    STAGED -> staged, HYBRID -> hybrid, STATIC -> static, MMAP -> mmap; "-" where the file or the row is
    absent or the row has no rate (a daemon that died), and the header says which;
  - the bars each mode misses (epochs > 1.25x NS's or a seed that never reaches the target; test more
    than 1 point below NS), and a table of every graph and mode at the end;
  - the mean "neighbour coverage" the daemon logs once per epoch ("-" where it logs none);
  - the worst gap over epoch budgets: for each E from ``--min-budget`` (10) to the shortest run of the
    pair, each run's test accuracy at its best validation epoch among epochs 1..E, mean over seeds;
    the largest NS - mode (points; positive = the mode below NS) and its E;
  - validation accuracy per epoch, mean over the seeds still running, one line per trained mode (needs
    matplotlib, the ``bench`` extra; skipped with a note without it).

The commands of one run (TRAIN = --model sage --hidden 256 --dropout 0.5 --lr 0.003 --epochs MAX
--patience P --seed S --json-out OUT --no-progress -q):

    NS:   python -m trainer --mode inmemory --dataset DS --batch-size 1024 --fanouts 10,5
              --eval-fanouts 10,5 --eval-batch-size 1024 --sampler-seed S TRAIN
    HB*, EX...: python -m loader.cli --no-progress serve --config WORK/runs/STEM.toml (STEM =
              NAME-pP-MODE[-rR]-seedS, -rR where the ratio sets the mode's fraction; output to
              WORK/logs/STEM.daemon.log; without -q, which would hide the INFO lines that carry the
              coverage), then
          python -m trainer --socket SOCK --connect-timeout 60 TRAIN; the daemon gets SIGTERM after.
    FULL: python bench/fullgraph_reference.py DS --seed S --max-epochs MAX --patience P --json-out OUT

Usage (a full run takes hours on 2 cores; keep --work to rerun without importing and preparing):

    .venv/bin/python bench/accuracy_bench.py [--work /var/tmp/mb-acc]
    .venv/bin/python bench/accuracy_bench.py --datasets amazon-photo --modes NS,HB,EX,STAGED --work /var/tmp/mb-acc
    .venv/bin/python bench/accuracy_bench.py --datasets cora-planetoid --seeds 0 --max-epochs 3 --patience 2
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.accuracy_report import (
    EXACT_MODES,
    IN_MEMORY_MODES,
    CompareEpochs,
    DatasetReport,
    EpochPoint,
    Run,
    analyse,
    dataset_markdown,
    mean,
    plot_curves,
    read_compare,
    scale_header,
    scale_markdown,
)
from bench.harness import RESULTS, ROOT, machine_description, sh, stop_process, wait_for_socket
from loader.daemon.config import ModeConfig
from loader.format.aggregates import dataset_cache
from loader.format.dataset import open_dataset

__all__ = ["DATASETS", "MODES", "DAEMON_EXTRA", "TomlValue", "megabatch_fraction", "takes_ratio", "daemon_tables",
           "toml_text", "run_stem", "main"]

PY = sys.executable
SHARED = ROOT.parent / "shared" / "data"
DATASETS = ("cora-planetoid", "citeseer-planetoid", "amazon-photo", "coauthor-cs", "coauthor-physics")
TomlValue = str | int | float | bool | list[int]
"""What the bench's daemon configs hold."""
MODES = ("NS", "HB", "HB25", *EXACT_MODES, "FULL", "HB25r", "HB25s", "HB50", "HB2", "NS16", "HB16", "NS8", "HB8",
         "NSAGG", "HBAGG", "HBW", "HBC")
# HB25 is HB at the default ratio 4; the exact-semantics modes cost no run unless --train-exact
DEFAULT_MODES = ("NS", "HB", *EXACT_MODES, "FULL")
DAEMON_EXTRA: dict[str, dict[str, dict[str, TomlValue]]] = {
    "HB": {}, "HB25": {"hierarchy": {"megabatch_fraction": 0.25}},
    **{mode: {"loader": {"mode": daemon_mode}} for mode, daemon_mode in EXACT_MODES.items()},
    # the remedy study (docs/PERFORMANCE.md): the old default grouping, no static cache, a half
    "HB25r": {"hierarchy": {"megabatch_fraction": 0.25, "schedule": "random"}},
    "HB25s": {"hierarchy": {"megabatch_fraction": 0.25, "static_cache": False}},
    "HB50": {"hierarchy": {"megabatch_fraction": 0.5}}, "HB2": {"memory": {"budget": "3G"}}, "HB16": {},
    "HBAGG": {"sampler": {"aggregation_cache": True}}, "HBW": {"hierarchy": {"label_prior_loss": True}},
    "HBC": {"hierarchy": {"formation": "comet"}}, "HB8": {}}
"""What each daemon mode adds to the default config (the fraction of ``--feature-ratio`` comes on top where
the mode sets none: ``daemon_tables``)."""
DEFAULT_DAEMON_MODE = ModeConfig().mode
"""The daemon mode HB runs (its config sets no [loader] mode): its row of compare.json times HB."""
RANKS = {"HB2": 2}
"""Daemon modes trained by several DDP ranks (the others: one trainer)."""
STORED_AS = {"NS16": "float16", "HB16": "float16", "NS8": "uint8", "HB8": "uint8"}
"""Modes run on a copy of the graph prepared with another feature dtype (``prepare --feat-dtype``)."""
AGGREGATED = {"NSAGG", "HBAGG"}
"""Modes that read the graph's mean aggregation cache (built once per prepared graph where it lacks one)."""
BYTES_PER_FEATURE = {"HB16": 2, "HB8": 4}
"""How many times fewer bytes a feature row takes in the mode (float16: 2, uint8 codes: 4): at the same
--feature-ratio in bytes its mega-batch holds that many times the partitions."""
COVERAGE = re.compile(r"neighbour coverage ([0-9.]+)")
SKEW = re.compile(r"neighbour coverage [0-9.]+, label skew ([0-9.]+)")


def megabatch_fraction(ratio: float) -> float:
    """``[hierarchy] megabatch_fraction`` under which the features are ``ratio`` times a mega-batch (1 / ratio)."""
    if not math.isfinite(ratio) or ratio < 1:
        raise ValueError(f"feature ratio: expected a number >= 1 (features over a mega-batch), got {ratio!r}")
    return 1 / ratio


def takes_ratio(extra: Mapping[str, Mapping[str, TomlValue]]) -> bool:
    """Whether a mode adding ``extra`` gets the fraction of ``--feature-ratio``: it sets no fraction of its own and
    picks no ``[loader] mode`` (a full-graph mode has no mega-batch to size)."""
    return "megabatch_fraction" not in extra.get("hierarchy", {}) and "mode" not in extra.get("loader", {})


def daemon_tables(base: Mapping[str, Mapping[str, TomlValue]], extra: Mapping[str, Mapping[str, TomlValue]],
                  ratio: float | None) -> dict[str, dict[str, TomlValue]]:
    """``base`` with ``extra``'s keys over it, plus the fraction of ``ratio`` (None: the daemon's "auto") where
    ``takes_ratio(extra)``."""
    tables = {name: dict(keys) for name, keys in base.items()}
    for name, keys in extra.items():
        tables.setdefault(name, {}).update(keys)
    if ratio is not None and takes_ratio(extra):
        tables.setdefault("hierarchy", {})["megabatch_fraction"] = megabatch_fraction(ratio)
    return tables


def _toml_value(table: str, key: str, value: TomlValue) -> str:
    # bool before int: True is an int to isinstance
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string takes JSON's escapes
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "[" + ", ".join(str(v) for v in value) + "]"
    raise TypeError(f"[{table}] {key}: no TOML for {value!r}")


def toml_text(tables: Mapping[str, Mapping[str, TomlValue]]) -> str:
    """The TOML of ``tables`` (one level of tables of scalars and integer lists), tables in insertion order."""
    lines = []
    for name, keys in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {_toml_value(name, key, value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


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
    parser.add_argument("--feature-ratio", default="4", type=_feature_ratio,
                        help="features over a mega-batch: megabatch_fraction = 1/R for every hierarchical mode that "
                        "sets none (default 4; auto: the daemon's own, the largest the budget holds)")
    parser.add_argument("--compare-json", type=Path, default=RESULTS / "compare.json",
                        help="bench/compare.py's results, whose per-mode epoch times give the time to accuracy at "
                        "scale (default bench/results/compare.json; absent: \"-\")")
    parser.add_argument("--train-exact", action="store_true",
                        help=f"train {', '.join(EXACT_MODES)} through the daemon instead of reusing NS's runs")
    parser.add_argument("--work", type=Path, help="prepared datasets, run outputs and logs (default: a temp dir); "
                        "datasets already there are reused")
    args = parser.parse_args(argv)
    args.datasets = args.datasets.split(",")
    args.modes = args.modes.split(",")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)} (choose from {', '.join(MODES)})")
    if not args.train_exact and "NS" not in args.modes and set(args.modes) & set(EXACT_MODES):
        parser.error(f"--modes: {', '.join(m for m in args.modes if m in EXACT_MODES)} reuse NS's runs: add NS, "
                     "or pass --train-exact")
    return args


def _feature_ratio(text: str) -> float | None:
    """None for "auto", else a ratio >= 1."""
    if text == "auto":
        return None
    try:
        ratio = float(text)
        megabatch_fraction(ratio)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 or auto, got {text!r}") from None
    return ratio


def reused(mode: str, args: argparse.Namespace) -> bool:
    """Whether ``mode``'s runs are NS's: an exact-semantics mode serves NS's batches, so unless asked to train
    it, its accuracy is known without a run."""
    return mode in EXACT_MODES and not args.train_exact


# ---------------------------------------------------------------- datasets and runs

def _build(out: Path, command: Callable[[Path], list[str]]) -> None:
    """Run ``command(out.partial)`` and rename its output to ``out``, so an interrupted step is redone."""
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    sh(command(partial))
    partial.rename(out)


DTYPE_SUFFIX = {"float16": "-f16", "uint8": "-u8"}


def prepare(name: str, work: Path, partitions: int, partitioner: str = "metis", feat_dtype: str | None = None
            ) -> Path:
    """``work/data/NAME-pP[-PARTITIONER][-f16|-u8]``: NAME imported and prepared (``feat_dtype``: stored as float16
    or as 8-bit codes), each step skipped when already done."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    suffix = ("" if partitioner == "metis" else f"-{partitioner}") + DTYPE_SUFFIX.get(feat_dtype or "", "")
    dtype = ["--feat-dtype", feat_dtype] if feat_dtype else []
    raw, out = data / f"{name}-raw", data / f"{name}-p{partitions}{suffix}"
    if not raw.exists():
        _build(raw, lambda to: [PY, "-m", "loader.cli", "-q", "import", str(SHARED / f"{name}.npz"), str(to),
                                "--format", "npz", "--split", "0.6,0.2,0.2", "--split-seed", "0"])
    if not out.exists():
        _build(out, lambda to: [PY, "-m", "loader.cli", "-q", "prepare", str(raw), str(to), "--partitions",
                                str(partitions), "--partitioner", partitioner, "--memory-budget", "2G", *dtype])
    return out


def daemon_config(mode: str, dataset: Path, sock: Path, seed: int, args: argparse.Namespace) -> str:
    """The TOML of a daemon run: defaults, plus what ``mode`` changes (``DAEMON_EXTRA``) and the fraction of
    ``--feature-ratio``."""
    fanouts = [int(f) for f in args.fanouts.split(",")]
    ranks = RANKS.get(mode, 1)
    server: dict[str, TomlValue] = {"socket": str(sock)}
    if ranks > 1:  # the same global batch, and a session for each rank
        server["max_clients"] = ranks
    base: dict[str, dict[str, TomlValue]] = {
        "dataset": {"path": str(dataset)},
        "sampler": {"batch_size": args.batch_size // ranks, "fanouts": fanouts, "eval_fanouts": fanouts,
                    "eval_batch_size": args.batch_size, "seed": seed},
        "server": server, "metrics": {"port": 0}}
    ratio = args.feature_ratio
    if ratio is not None and mode in BYTES_PER_FEATURE:
        ratio = max(1.0, ratio / BYTES_PER_FEATURE[mode])
    return toml_text(daemon_tables(base, DAEMON_EXTRA[mode], ratio))


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


def run_stem(name: str, mode: str, seed: int, args: argparse.Namespace) -> str:
    """The file names of one run: they name the partitioning and the ratio where the run depends on them, so
    that --reuse in a --work shared by several settings never takes another setting's run."""
    partitions = f"p{args.partitions}" + ("" if args.partitioner == "metis" else f"-{args.partitioner}")
    ratio = f"-r{args.feature_ratio:g}" if args.feature_ratio is not None and mode in DAEMON_EXTRA and \
        takes_ratio(DAEMON_EXTRA[mode]) else ""
    return f"{name}-{partitions}-{mode}{ratio}-seed{seed}"


def one_run(name: str, dataset: Path, mode: str, seed: int, dirs: dict[str, Path], args: argparse.Namespace) -> Run:
    """Train once in ``mode`` and read the result back."""
    stem = run_stem(name, mode, seed, args)
    out = dirs["runs"] / f"{stem}.json"
    trainer_log, daemon_log = dirs["logs"] / f"{stem}.trainer.log", dirs["logs"] / f"{stem}.daemon.log"
    if args.reuse and out.exists():  # the json is written atomically once a run ends: a finished run
        return read_run(name, mode, seed, out, daemon_log if mode in DAEMON_EXTRA else None, float("nan"))
    out.unlink(missing_ok=True)
    trainer_log.unlink(missing_ok=True)
    started = time.monotonic()
    if mode in IN_MEMORY_MODES:
        cache = ["--aggregation-cache"] if mode == "NSAGG" else []
        run_logged([PY, "-m", "trainer", "--mode", "inmemory", "--dataset", str(dataset), "--batch-size",
                    str(args.batch_size), "--fanouts", args.fanouts, "--eval-fanouts", args.fanouts,
                    "--eval-batch-size", str(args.batch_size), "--sampler-seed", str(seed), *cache,
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


def write_outputs(stem: str, reports: list[DatasetReport], args: argparse.Namespace,
                  scale: CompareEpochs | None) -> None:
    """``RESULTS/STEM.{json,md}`` with every graph finished so far."""
    machine = machine_description()
    header = (f"# Accuracy to convergence\n\n{machine}; seeds {args.seeds}, max {args.max_epochs} epochs, "
              f"patience {args.patience}, {args.partitions} {args.partitioner} partitions, fanouts {args.fanouts}, "
              f"batch {args.batch_size}, device {args.device}; `bench/accuracy_bench.py`.\n\n"
              + scale_header(args.feature_ratio, scale, args.compare_json, args.batch_size) + "\n")
    (RESULTS / f"{stem}.md").write_text(header + "\n".join(dataset_markdown(r, args.min_budget) for r in reports)
                                        + "\n" + scale_markdown(reports))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    data = {"args": settings, "machine": machine, "compare": None if scale is None else asdict(scale),
            "datasets": {r.name: asdict(r) for r in reports}}
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=2))


def run_dataset(name: str, dirs: dict[str, Path], args: argparse.Namespace) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {}
    for mode in args.modes:
        if reused(mode, args):
            continue
        dataset = prepare(name, dirs["work"], args.partitions, args.partitioner, feat_dtype=STORED_AS.get(mode))
        cache = dataset_cache(open_dataset(dataset)) if mode in AGGREGATED else None
        if mode in AGGREGATED and (cache is None or cache.kind != "mean"):
            sh([PY, "-m", "loader.cli", "-q", "aggregate", str(dataset), "--kind", "mean"])
        for seed in args.seeds:
            run = one_run(name, dataset, mode, seed, dirs, args)
            runs.setdefault(mode, []).append(run)
            best = run.best()
            coverage = f", coverage {mean(run.coverage):.3f}" if run.coverage else ""
            print(f"{name} {mode} seed {seed}: test {best.test_acc:.4f} at best val {best.val_acc:.4f} (epoch "
                  f"{best.epoch} of {run.epochs[-1].epoch}{', stopped early' if run.stopped_early else ''}), "
                  f"{'reused' if math.isnan(run.wall_seconds) else f'{run.wall_seconds:.0f} s'}{coverage}",
                  flush=True)
    # the reused modes take NS's runs wherever they stand in --modes, so the report keeps that order
    return {mode: [replace(r, mode=mode, wall_seconds=float("nan"), reused_from="NS") for r in runs["NS"]]
            if reused(mode, args) else runs[mode] for mode in args.modes}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: subprocess.run kills the trainer and ``daemon`` stops its daemon on the way
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    RESULTS.mkdir(parents=True, exist_ok=True)
    # one file per dataset set (and tag), so runs of other sets are kept
    stem = "accuracy-" + "-".join(args.datasets) + (f"-{args.tag}" if args.tag else "")
    reports: list[DatasetReport] = []
    scale = read_compare(args.compare_json) if args.compare_json.exists() else None
    if scale is None:
        print(f"bench: {args.compare_json} is absent: no time to accuracy at scale (\"-\")", flush=True)
    with (tempfile.TemporaryDirectory(prefix="mb-acc-", dir=os.environ.get("TMPDIR")) as tmp,
          tempfile.TemporaryDirectory(prefix="mb-sock-", dir="/tmp") as sockets):  # short path: sun_path <= 107 B
        work = (args.work or Path(tmp)).resolve()
        dirs = {"work": work, "runs": work / "runs", "logs": work / "logs", "sockets": Path(sockets)}
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        for name in args.datasets:
            reports.append(analyse(name, run_dataset(name, dirs, args), args.min_budget, scale, DEFAULT_DAEMON_MODE))
            write_outputs(stem, reports, args, scale)
            if not plot_curves(reports[-1], RESULTS / f"accuracy-{name}{f'-{args.tag}' if args.tag else ''}.png"):
                print("bench: matplotlib not importable (pip install -e '.[bench]'); no accuracy curve", flush=True)
        print((RESULTS / f"{stem}.md").read_text())
    print(f"results: {RESULTS / (stem + '.md')}, {RESULTS / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
