"""Where do the training labels live? MariusGNN's node-classification policy keeps every partition holding a
training node resident, so it pays only where those partitions are a small share of the graph (issue 28).

For each prepared dataset given, prints the training nodes, the partitions that hold at least one, and the
share of the graph's nodes in those partitions: the fraction of the graph the policy would keep resident.
At R = 4 a mega-batch holds 1/4 of it.

Usage: ``python bench/label_partitions.py DATASET...`` (prepared datasets, e.g. the accuracy bench's
``--work``/data/<graph>-p<P>).
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from loader.format.dataset import open_dataset

__all__ = ["label_partitions", "main"]


def label_partitions(path: Path) -> tuple[int, int, int, float]:
    """(training nodes, partitions holding one or more, partitions, share of the nodes in those partitions)."""
    dataset = open_dataset(path)
    parts = dataset.partitions()
    train = dataset.read("train", np.int64, 1)
    holding = np.unique(parts.partition_of(train)) if len(train) else np.zeros(0, dtype=np.int64)
    sizes = parts.node_end - parts.node_begin
    return len(train), len(holding), len(sizes), float(sizes[holding].sum() / max(1, sizes.sum()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("datasets", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print("| dataset | training nodes | partitions holding one | share of the nodes there |")
    print("|---|---|---|---|")
    for path in args.datasets:
        train, holding, partitions, share = label_partitions(path)
        print(f"| {path.name} | {train:,} | {holding} of {partitions} | {share:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
