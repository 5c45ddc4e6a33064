"""bench/held_load_bench.py: both loads build the same CSR in their own processes, and the table gives the ratios."""

import pytest

from bench.held_load_bench import main
from loader.offline.prepare import PrepareOptions, prepare_dataset
from tests.graphs import link_input_graph, link_raw


def test_the_two_loads_side_by_side(tmp_path, capsys):
    src, dst = link_input_graph(3, 200, 600, symmetric=True)
    raw = link_raw(tmp_path / "raw", src, dst, 200, feat_dim=500, undirected=True, eval_negatives=10,
                   feature_density=0.01)
    prepare_dataset(raw.path, tmp_path / "ds", PrepareOptions(num_partitions=4, memory_budget=64 << 20,
                                                              progress=False))
    assert main(["--dataset", str(tmp_path / "ds"), "--repeats", "1"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row[0] for row in rows[1:]] == ["| dense matrix, then the CSR", "| `load_held`, partition by partition",
                                            "| ratio (dense / held, means)"]
    assert all(cell.endswith("x") for cell in rows[-1][1:-1])


def test_a_directory_that_is_not_a_dataset_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--dataset", str(tmp_path)])
    assert exit_.value.code == 2 and "not a prepared dataset" in capsys.readouterr().err
