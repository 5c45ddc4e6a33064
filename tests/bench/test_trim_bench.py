"""bench/trim_bench.py: both trims timed on a link dataset's batches, the ratio to the model's."""

import pytest

from bench.trim_bench import main
from loader.offline.prepare import PrepareOptions, prepare_dataset
from tests.graphs import link_input_graph, link_raw


def test_both_trims_side_by_side(tmp_path, capsys):
    src, dst = link_input_graph(3, 200, 600, symmetric=True)
    raw = link_raw(tmp_path / "raw", src, dst, 200, feat_dim=50, undirected=True, eval_negatives=10)
    prepare_dataset(raw.path, tmp_path / "ds", PrepareOptions(num_partitions=4, memory_budget=64 << 20,
                                                              progress=False))
    assert main(["--dataset", str(tmp_path / "ds"), "--batch-size", "32", "--batches", "2", "--rounds", "1"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row[0] for row in rows[1:]] == ["| trim_edges", "| trim_to_layer + pad"]
    assert rows[1][2] == "1.00x |" and rows[2][2].endswith("x |")


def test_a_directory_that_is_not_a_dataset_is_refused(tmp_path, capsys):
    assert main(["--dataset", str(tmp_path)]) == 2
    assert "trim_bench: error:" in capsys.readouterr().err


def test_counts_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--dataset", str(tmp_path), "--batches", "0"])
    assert exit_.value.code == 2 and "at least 1" in capsys.readouterr().err


def test_node_batches_too(dataset_3k, capsys):
    assert main(["--dataset", str(dataset_3k), "--task", "node", "--batch-size", "64", "--batches", "2",
                 "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "(node): 2 steps each" in out and "batches of 64 seeds" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")]
    assert [row[0] for row in rows[1:]] == ["| trim_edges", "| trim_to_layer + pad"]
