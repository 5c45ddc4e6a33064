"""bench/label_partitions.py: the partitions holding a training node, against a plain count."""

import numpy as np

from bench.label_partitions import label_partitions, main
from loader.format.dataset import open_dataset


def test_the_partitions_holding_training_nodes_are_counted(dataset_3k, capsys):
    dataset = open_dataset(dataset_3k)
    parts = dataset.partitions()
    train = dataset.read("train", np.int64, 1)
    holding = {p for p in range(len(parts.node_begin))
               if ((train >= parts.node_begin[p]) & (train < parts.node_end[p])).any()}
    nodes = sum(int(parts.node_end[p] - parts.node_begin[p]) for p in holding)
    count, held, partitions, share = label_partitions(dataset_3k)
    assert (count, held, partitions) == (len(train), len(holding), len(parts.node_begin))
    assert share == nodes / int(parts.node_end[-1] - parts.node_begin[0])
    assert main([str(dataset_3k)]) == 0
    assert f"| {dataset_3k.name} | {len(train):,} | {len(holding)} of {partitions} |" in capsys.readouterr().out
