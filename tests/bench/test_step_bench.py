"""bench/step_bench.py: every variant of the step timed on a dataset's batches, the ratios to the step as run."""

import pytest
import torch

from bench.step_bench import VARIANTS, main, pyg_pattern
from loader.offline.prepare import PrepareOptions, prepare_dataset
from tests.graphs import link_input_graph, link_raw
from trainer.models import build_model


def _rows(out: str) -> list[list[str]]:
    return [line.split(" | ") for line in out.splitlines() if line.startswith("| ")]


def test_every_variant_side_by_side_on_link_batches(tmp_path, capsys):
    src, dst = link_input_graph(3, 200, 600, symmetric=True)
    raw = link_raw(tmp_path / "raw", src, dst, 200, feat_dim=50, undirected=True, eval_negatives=10)
    prepare_dataset(raw.path, tmp_path / "ds", PrepareOptions(num_partitions=4, memory_budget=64 << 20,
                                                              progress=False))
    assert main(["--dataset", str(tmp_path / "ds"), "--batch-size", "32", "--batches", "2", "--rounds", "1"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert [row[0] for row in rows[1:]] == [f"| {variant}" for variant in VARIANTS]
    assert rows[1][2] == "1.00x |" and all(row[2].endswith("x |") for row in rows[2:])


def test_node_batches_and_gcn_too(dataset_3k, capsys):
    assert main(["--dataset", str(dataset_3k), "--task", "node", "--model", "gcn", "--batch-size", "64",
                 "--batches", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "(node, gcn): 2 steps each" in out and "batches of 64 seeds" in out
    assert [row[0] for row in _rows(out)[1:]] == [f"| {variant}" for variant in VARIANTS]


def test_the_old_pattern_with_torchs_dropout_draws_other_masks_of_the_same_shape():
    # the variants the bench times are real alternatives: the pad pattern with the model's dropout is the model
    # (tests/trainer/test_models.py, bit for bit); with torch's dropout the masks differ
    x = torch.randn(6, 4)
    edge_index = torch.tensor([[1, 2, 3, 4, 5], [0, 0, 1, 2, 1]])
    torch.manual_seed(0)
    model = build_model("sage", 4, 8, 3, 2, 0.5).train()
    torch.manual_seed(1)
    ours = model(x, edge_index, [1, 2, 3], [2, 3])
    torch.manual_seed(1)
    theirs = pyg_pattern(model, x, edge_index, [1, 2, 3], [2, 3],
                         drop=lambda t, p, training: torch.nn.functional.dropout(t, p=p, training=training))
    outs = [ours, theirs]
    assert outs[0].shape == outs[1].shape == (1, 3) and not torch.equal(outs[0], outs[1])


def test_a_directory_that_is_not_a_dataset_is_refused(tmp_path, capsys):
    assert main(["--dataset", str(tmp_path)]) == 2
    assert "step_bench: error:" in capsys.readouterr().err


def test_counts_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--dataset", str(tmp_path), "--batches", "0"])
    assert exit_.value.code == 2 and "at least 1" in capsys.readouterr().err
