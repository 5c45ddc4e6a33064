"""bench/link_variants.py: COMET's ablations keep its edge order (every training edge once an epoch, state by
state) and change only where neighbours and negatives come from."""

from pathlib import Path

import numpy as np
import pytest

from bench.link_bench import parse_args, train_command
from bench.link_variants import VARIANTS, main
from loader.format.dataset import open_dataset
from tests.trainer.test_link_train import link_dataset  # noqa: F401
from trainer.link import inmemory
from trainer.link.inmemory import LinkInMemorySource


def pairs_and_negatives(source, epoch):
    """Each batch's positives and negative pairs as dataset ids: ([(2, B)], [(2, B k)])."""
    positives, negatives = [], []
    for batch in source.train_batches(epoch):
        ids = batch.graph.n_id.numpy()
        pairs = ids[batch.edge_label_index.numpy()]
        label = batch.edge_label.numpy()
        positives.append(pairs[:, label == 1])
        negatives.append(pairs[:, label == 0])
    return positives, negatives


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - {"comet-tail-batches"}))
def test_a_variant_keeps_comets_edge_order(link_dataset, variant):  # noqa: F811
    dataset = open_dataset(link_dataset)
    settings = {"batch_size": 32, "fanouts": (3, 3), "seed": 4, "link_order": "comet", "buffer_partitions": 2}
    comet, other = LinkInMemorySource(dataset, **settings), VARIANTS[variant](dataset, **settings)
    order = comet.buffer_epoch(1)
    want, comet_negatives = pairs_and_negatives(comet, 1)
    got, negatives = pairs_and_negatives(other, 1)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)  # the same positives in the same batches
    batch_state = np.repeat([s.index for s in order.states], [s.num_batches for s in order.states])
    resident = {s.index: set(s.resident_nodes().tolist()) for s in order.states}
    outside = [sum(t not in resident[batch_state[i]] for t in tails[1].tolist()) for i, tails in enumerate(negatives)]
    assert not any(sum(t not in resident[batch_state[i]] for t in tails[1].tolist())
                   for i, tails in enumerate(comet_negatives))  # COMET's negatives come from its buffer
    if variant in ("comet-global-neighbours", "comet-source-weighted-negatives"):
        assert not any(outside)
    else:
        assert sum(outside) > 0  # negatives from beyond the buffer
    if variant == "comet-hybrid-negatives":  # a resident node's sampled neighbours are resident ones
        for i, batch in enumerate(other.train_batches(1)):
            ids, edges = batch.graph.n_id.numpy(), batch.graph.edge_index.numpy()
            src, dst = ids[edges[0]], ids[edges[1]]
            inside = np.array([int(d) in resident[batch_state[i]] for d in dst], dtype=bool)
            assert all(int(s) in resident[batch_state[i]] for s in src[inside])


def test_tail_batches_cut_comets_states_into_full_batches_and_a_short_last_one(link_dataset):  # noqa: F811
    dataset = open_dataset(link_dataset)
    settings = {"batch_size": 32, "fanouts": (3, 3), "seed": 4, "link_order": "comet", "buffer_partitions": 2}
    comet, tail = LinkInMemorySource(dataset, **settings), VARIANTS["comet-tail-batches"](dataset, **settings)
    balanced, plain = comet.buffer_epoch(1), tail.buffer_epoch(1)
    assert plain.batches.order.tolist() == balanced.batches.order.tolist()  # the same edges in the same order
    for a, b in zip(balanced.states, plain.states, strict=True):
        sizes, equal = np.diff(b.batch_ptr), np.diff(a.batch_ptr)
        assert (sizes[:-1] == 32).all() and len(sizes) == len(equal)
        assert len(equal) == 0 or equal.max() - equal.min() <= 1
    assert any(np.diff(s.batch_ptr)[-1] < 32 for s in plain.states)  # the case the variant exists for
    want, _ = pairs_and_negatives(comet, 1)
    got, _ = pairs_and_negatives(tail, 1)
    np.testing.assert_array_equal(np.concatenate(want, axis=1), np.concatenate(got, axis=1))
    command = train_command(link_dataset, "comet-tail-batches", 0, Path("/o.json"), parse_args([]))
    assert command[-4:] == ["--link-order", "comet", "--buffer-partitions", "8"]  # the product's weighted negatives


def test_a_variant_order_runs_its_source_in_the_trainer(link_dataset, tmp_path, capsys):  # noqa: F811
    command = train_command(link_dataset, "comet-widened", 0, tmp_path / "o.json", parse_args([]))
    assert command[1].endswith("bench/link_variants.py") and command[2] == "comet-widened"
    # a variant takes plain COMET apart: its negatives unweighted
    assert command[-5:] == ["--link-order", "comet", "--buffer-partitions", "8", "--no-negative-weights"]
    code = main(["comet-uniform-negatives", "--mode", "inmemory", "--dataset", str(link_dataset), "--task", "link",
                 "--hidden", "8", "--batch-size", "128", "--fanouts", "3,3", "--epochs", "1", "--link-order", "comet",
                 "--buffer-partitions", "2", "-q", "--no-progress"])
    assert code == 0
    assert inmemory.LinkInMemorySource is LinkInMemorySource  # put back for whatever runs next in this process
    assert main(["no-such-variant"]) == 2 and "usage: link_variants.py" in capsys.readouterr().err


def test_source_weighted_negatives_weigh_the_sources_partition_alone(link_dataset):  # noqa: F811
    dataset = open_dataset(link_dataset)
    settings = {"batch_size": 32, "fanouts": (3, 3), "seed": 4, "link_order": "comet", "buffer_partitions": 2}
    source = VARIANTS["comet-source-weighted-negatives"](dataset, **settings)
    table = dataset.partitions()
    order = source.buffer_epoch(1)
    batch_state = np.repeat([s.index for s in order.states], [s.num_batches for s in order.states])
    n = dataset.manifest.num_nodes
    for i, batch in enumerate(source.train_batches(1)):
        resident = len(order.states[batch_state[i]].resident_nodes())
        weight = batch.edge_weight.numpy()
        b = batch.positives
        assert (weight[:b] == 1).all()
        pairs = batch.graph.n_id.numpy()[batch.edge_label_index.numpy()]
        for m in range(b, len(weight)):
            src, tail = (int(p) for p in table.partition_of(pairs[:, m]))
            size = int(table.num_nodes[src])
            want = resident / n if tail == src else (1 - size / n) / (1 - size / resident)
            assert weight[m] == pytest.approx(want, rel=1e-6)
