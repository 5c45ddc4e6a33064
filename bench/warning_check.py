"""Does the label-skew warning predict the loss? The daemon's per-epoch quality rule, replayed offline on the
accuracy bench's configurations, against the accuracy gaps those configurations measured.

The skew a hierarchical epoch reports is a function of the prepared dataset, the partition count, the fraction
and the sampler seed alone (``schedule_epoch`` + ``LabelMix``: no training), so this replays exactly what the
daemon logs for each epoch and seed in seconds, where training to convergence takes hours. The gaps come from
``bench/accuracy_bench.py`` results (``--accuracy-json``, the worst HB - NS gap over epoch budgets >= 10) or,
without them, from the runs recorded in docs/PERFORMANCE.md ("Out of core: R = 4, 3 seeds, 32 and 256 partitions").

The bar (issue 28): the warning fires in every seed of every configuration whose gap exceeds 2 points, and in
no epoch of any configuration within 0.5 points.

    .venv/bin/python bench/warning_check.py [--work /var/tmp/mb-acc-r4] [--accuracy-json F ...]
"""

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401

import numpy as np

from bench.accuracy_bench import prepare
from bench.harness import RESULTS, machine_description
from loader.daemon.hierarchical.coverage import CHANCE_MULTIPLE, EXCESS_SKEW_WARN, EpochQuality, NeighbourSlots
from loader.daemon.hierarchical.schedule import LabelMix, schedule_epoch, train_label_counts
from loader.format.dataset import open_dataset

RECORDED_GAPS = {
    ("cora-planetoid", 32): -1.20, ("citeseer-planetoid", 32): -1.03, ("amazon-photo", 32): 3.55,
    ("cora-planetoid", 256): -1.67, ("citeseer-planetoid", 256): 0.70, ("amazon-photo", 256): 0.15,
}
"""Worst HB - NS test gap (points, E >= 10, mean of seeds 0-2) at R = 4: docs/PERFORMANCE.md's R = 4 table."""
LOSS_POINTS = 2.0
QUIET_POINTS = 0.5


@dataclass(frozen=True)
class EpochVerdict:
    seed: int
    epoch: int
    skew: float
    chance: float
    excess: float
    warns: bool


@dataclass(frozen=True)
class ConfigCheck:
    graph: str
    partitions: int
    per_megabatch: int
    gap_points: float | None
    epochs: list[EpochVerdict]

    @property
    def warned_seeds(self) -> set[int]:
        return {e.seed for e in self.epochs if e.warns}

    @property
    def seeds(self) -> set[int]:
        return {e.seed for e in self.epochs}

    @property
    def verdict(self) -> str:
        """"right", "missed" (a loss without the warning in some seed), "false alarm", or "no bar" in between."""
        if self.gap_points is None:
            return "no gap measured"
        if self.gap_points > LOSS_POINTS:
            return "right" if self.warned_seeds == self.seeds else "missed"
        if self.gap_points <= QUIET_POINTS:
            return "right" if not self.warned_seeds else "false alarm"
        return "no bar"


def replay(dataset_dir: Path, ratio: float, seeds: list[int], epochs: int) -> tuple[int, list[EpochVerdict]]:
    """Every epoch's quality as the daemon computes it (balanced schedule, seed-weighted over mega-batches)."""
    dataset = open_dataset(dataset_dir)
    parts = dataset.partitions()
    labels = dataset.read("labels", np.int64, 1)
    train = np.sort(dataset.read("train", np.int64, 1))
    counts = train_label_counts(parts, train, labels)
    mix = LabelMix(counts)
    num_parts = len(parts)
    per = min(num_parts, max(1, round(num_parts / ratio)))  # memplan.plan_memory's N_d for a fixed fraction
    seeds_per_part = parts.count_in(train)
    verdicts = []
    for seed in seeds:
        for epoch in range(epochs):
            quality = EpochQuality()
            for scheduled in schedule_epoch(num_parts, per, seed, epoch, counts):
                quality.add(NeighbourSlots(0, 0), mix.of(mix.group_counts(scheduled.partitions)),
                            int(seeds_per_part[scheduled.partitions].sum()))
            verdicts.append(EpochVerdict(seed, epoch, quality.skew, quality.chance, quality.excess,
                                         "skew" in quality.warnings()))
    return per, verdicts


def accuracy_gaps(paths: list[Path]) -> dict[tuple[str, int], float]:
    """HB's worst gap per (graph, partitions) from accuracy-bench result files."""
    gaps = {}
    for path in paths:
        data = json.loads(path.read_text())
        partitions = int(data["args"]["partitions"])
        for name, report in data["datasets"].items():
            for gap in report["gaps"]:
                if gap["mode"] == "HB" and gap["gap_points"] is not None:
                    gaps[(name, partitions)] = float(gap["gap_points"])
    return gaps


def markdown(checks: list[ConfigCheck], source: str) -> str:
    lines = [f"# Does the label-skew warning predict the loss?\n\n{machine_description()}; gaps from {source}; "
             f"warning when the skew beyond chance exceeds max({EXCESS_SKEW_WARN}, {CHANCE_MULTIPLE:g} x chance). "
             f"Bar: warned in every seed where the gap > {LOSS_POINTS} pt, in no epoch where it is <= "
             f"{QUIET_POINTS} pt.\n",
             "| graph | partitions | N_d | skew | chance | excess | epochs warned | worst gap | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        skew, chance, excess = (float(np.mean([getattr(e, f) for e in c.epochs])) for f in ("skew", "chance", "excess"))
        warned = sum(e.warns for e in c.epochs)
        gap = "-" if c.gap_points is None else f"{c.gap_points:+.2f} pt"
        lines.append(f"| {c.graph} | {c.partitions} | {c.per_megabatch} | {skew:.3f} | {chance:.3f} | {excess:.3f} | "
                     f"{warned} of {len(c.epochs)} | {gap} | {c.verdict} |")
    right = sum(c.verdict == "right" for c in checks)
    barred = sum(c.verdict in ("right", "missed", "false alarm") for c in checks)
    lines.append(f"\n{right} of {barred} configurations under the bar are right.\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/mb-acc-r4"),
                    help="accuracy_bench's --work: prepared datasets are reused (or made there)")
    ap.add_argument("--datasets", default="cora-planetoid,citeseer-planetoid,amazon-photo")
    ap.add_argument("--partitions", default="32,256")
    ap.add_argument("--feature-ratio", type=float, default=4.0)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--accuracy-json", type=Path, nargs="*", default=[],
                    help="accuracy_bench result files to take the gaps from (default: the recorded ones)")
    args = ap.parse_args(argv)
    gaps = accuracy_gaps(args.accuracy_json) if args.accuracy_json else RECORDED_GAPS
    source = ", ".join(str(p) for p in args.accuracy_json) or "docs/PERFORMANCE.md's R = 4 runs"
    seeds = [int(s) for s in args.seeds.split(",")]
    checks = []
    for partitions in (int(p) for p in args.partitions.split(",")):
        for name in args.datasets.split(","):
            per, verdicts = replay(prepare(name, args.work, partitions), args.feature_ratio, seeds, args.epochs)
            checks.append(ConfigCheck(name, partitions, per, gaps.get((name, partitions)), verdicts))
    text = markdown(checks, source)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "warning-check.md").write_text(text)
    (RESULTS / "warning-check.json").write_text(json.dumps(
        [dict(asdict(c), verdict=c.verdict) for c in checks], indent=2))
    print(text)
    return 0 if all(c.verdict in ("right", "no bar", "no gap measured") for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
