"""bench/input_layer_bench.py: its arguments are checked before any work (the timing itself is a benchmark)."""

import pytest

from bench import input_layer_bench


@pytest.mark.parametrize("argv", [["--models", "gat"], ["--models", ""], ["--repeats", "0"], ["--threads", "0"],
                                  ["--densities", "0"], ["--densities", "x"], ["--densities", "1.5"],
                                  ["--batch-size", "0"]])
def test_bad_arguments_are_one_line_and_exit_2(capsys, argv):
    assert input_layer_bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("input_layer_bench: error:")


@pytest.mark.parametrize("density", [1.0, 0.01], ids=["dense-features", "held-sparse"])
def test_whole_steps_on_a_datasets_batches(tmp_path, capsys, density):
    from loader.offline.prepare import PrepareOptions, prepare_dataset
    from tests.graphs import link_input_graph, link_raw

    src, dst = link_input_graph(5, 200, 800, symmetric=True)
    raw = link_raw(tmp_path / "raw", src, dst, 200, feat_dim=8 if density == 1.0 else 1000, undirected=True,
                   feature_density=density)
    prepare_dataset(raw.path, tmp_path / "ds", PrepareOptions(num_partitions=2, memory_budget=64 << 20, progress=False))
    assert input_layer_bench.main(["--dataset", str(tmp_path / "ds"), "--batch-size", "32", "--repeats", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if line.startswith(("| sage", "| gcn"))]) == 2
    # the gather table only where the features are held sparse
    assert len([line for line in out if line.startswith("| gather")]) == (density < 1.0)


def test_a_missing_dataset_is_one_line_and_exit_2(tmp_path, capsys):
    assert input_layer_bench.main(["--dataset", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("input_layer_bench: error:")


def test_node_batches_held_dense_and_sparse(tmp_path, capsys):
    from loader.offline.prepare import PrepareOptions, prepare_dataset
    from tests.graphs import link_input_graph, link_raw

    src, dst = link_input_graph(5, 200, 800, symmetric=True)  # a link dataset keeps its labels: node batches too
    raw = link_raw(tmp_path / "raw", src, dst, 200, feat_dim=1000, undirected=True, feature_density=0.01)
    prepare_dataset(raw.path, tmp_path / "ds", PrepareOptions(num_partitions=2, memory_budget=64 << 20, progress=False))
    assert input_layer_bench.main(["--dataset", str(tmp_path / "ds"), "--task", "node", "--batch-size", "32",
                                   "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "held sparse: 1." in out or "held sparse: 0." in out
    assert len([line for line in out.splitlines() if line.startswith(("| sage", "| gcn"))]) == 2
