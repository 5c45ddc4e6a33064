"""The training loop: it learns, resumes bit for bit, stops early, and refuses broken input."""

import json
import socket
import urllib.request
from collections.abc import Iterator

import pytest
import torch
from prometheus_client import generate_latest

from proto.errors import UserError
from tests.graphs import generated_dataset
from trainer.batch import Batch
from trainer.inmemory_source import InMemorySource
from trainer.loop import SequenceError, TrainConfig, format_epoch, train
from trainer.metrics import TrainerMetrics
from trainer.source import BatchSource, SourceInfo


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    ds = generated_dataset(tmp_path_factory.mktemp("loop"), nodes=2000, feat_dim=16, classes=4)
    return InMemorySource(ds, batch_size=200, fanouts=(5, 5), eval_batch_size=1000, seed=3)


class ToySource(BatchSource):
    """Hand-made one-hop batches of 8 seeds (random labels); records every release."""

    def __init__(self, batches: int = 3, seqs: list[int] | None = None) -> None:
        self.batches = batches
        self.seqs = seqs if seqs is not None else list(range(batches))
        self.released: list[int] = []
        self.handed_out = 0

    @property
    def info(self) -> SourceInfo:
        return SourceInfo(num_features=4, num_classes=3, num_hops=1, batch_size=8, train_nodes=8 * self.batches,
                          description="toy")

    def _batch(self, key: int, seq: int) -> Batch:
        gen = torch.Generator().manual_seed(key)
        self.handed_out += 1
        return Batch(x=torch.randn(16, 4, generator=gen), y=torch.randint(0, 3, (8,), generator=gen),
                     edge_index=torch.stack([torch.randint(8, 16, (16,), generator=gen), torch.arange(8).repeat(2)]),
                     n_id=torch.arange(16), num_sampled_nodes=[8, 8], num_sampled_edges=[16], seq=seq,
                     _release=lambda: self.released.append(seq))

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        for b, seq in enumerate(self.seqs):
            yield self._batch(epoch * 100 + b, seq)

    def eval_batches(self, split: str) -> Iterator[Batch]:
        for b in range(2):
            yield self._batch(10_000 + b + (100 if split == "test" else 0), b)


def test_sage_learns_well_above_chance(source):
    lines: list[str] = []
    result = train(source, TrainConfig(hidden=32, epochs=4, lr=0.01, seed=0), log=lines.append)
    assert len(result.epochs) == 4 and len(lines) == 4 and lines[0].startswith("epoch 1/4  loss ")
    assert result.best_epoch is not None and result.test_acc_at_best is not None
    print(result.summary())
    assert result.test_acc_at_best > 0.6  # 4 classes: chance is 0.25
    first, last = result.epochs[0], result.epochs[-1]
    assert last.loss < first.loss
    assert last.samples == source.info.train_nodes and last.batches == 7
    assert 0.0 <= last.data_wait <= 1.0 and last.samples_per_s > 0
    json.dumps(result.to_json())


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_gcn_and_gat_learn(source, model):
    result = train(source, TrainConfig(model=model, hidden=32, epochs=3, lr=0.01, seed=0))
    assert result.test_acc_at_best is not None and result.test_acc_at_best > 0.6, result.summary()


def test_resume_reproduces_the_uninterrupted_run_bitwise(source, tmp_path):
    straight = train(source, TrainConfig(hidden=16, epochs=3, seed=5, checkpoint=tmp_path / "a.pt"))
    train(source, TrainConfig(hidden=16, epochs=2, seed=5, checkpoint=tmp_path / "b.pt"))
    resumed = train(source, TrainConfig(hidden=16, epochs=3, seed=5, checkpoint=tmp_path / "b.pt", resume=True))
    assert resumed.resumed_from_epoch == 2
    assert straight.model is not None and resumed.model is not None
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r.loss for r in straight.epochs] == [r.loss for r in resumed.epochs]
    assert (straight.best_epoch, straight.test_acc_at_best) == (resumed.best_epoch, resumed.test_acc_at_best)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt"]  # no temporary files left


def test_resume_refuses_missing_corrupt_and_incompatible_checkpoints(tmp_path):
    path = tmp_path / "ck.pt"
    with pytest.raises(UserError, match="no checkpoint to resume from"):
        train(ToySource(), TrainConfig(hidden=8, epochs=2, checkpoint=path, resume=True))
    train(ToySource(), TrainConfig(hidden=8, epochs=1, checkpoint=path))
    with pytest.raises(UserError, match="incompatible.*hidden 8 in the checkpoint, 16 now"):
        train(ToySource(), TrainConfig(hidden=16, epochs=2, checkpoint=path, resume=True))
    with pytest.raises(UserError, match="incompatible.*model 'sage' in the checkpoint, 'gcn' now"):
        train(ToySource(), TrainConfig(model="gcn", hidden=8, epochs=2, checkpoint=path, resume=True))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="corrupt or unreadable checkpoint"):
        train(ToySource(), TrainConfig(hidden=8, epochs=2, checkpoint=path, resume=True))
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(UserError, match="corrupt or unreadable checkpoint"):
        train(ToySource(), TrainConfig(hidden=8, epochs=2, checkpoint=path, resume=True))
    torch.save({"format": "something else"}, path)
    with pytest.raises(UserError, match="not a megabatch trainer checkpoint"):
        train(ToySource(), TrainConfig(hidden=8, epochs=2, checkpoint=path, resume=True))


def test_early_stopping_stops_after_patience_evaluations_without_progress(tmp_path):
    # a learning rate this small cannot move any prediction: val accuracy stays put after epoch 1
    cfg = TrainConfig(hidden=8, epochs=10, lr=1e-12, patience=2, checkpoint=tmp_path / "ck.pt")
    result = train(ToySource(), cfg)
    assert [r.epoch for r in result.epochs] == [1, 2, 3] and result.stopped_early and result.best_epoch == 1
    assert "stopped early after epoch 3" in result.summary()
    again = train(ToySource(), TrainConfig(hidden=8, epochs=10, lr=1e-12, patience=2, checkpoint=tmp_path / "ck.pt",
                                           resume=True))
    assert len(again.epochs) == 3 and again.stopped_early  # a finished run stays finished


def test_max_steps_cuts_the_run_mid_epoch_without_evaluating_and_releases_everything():
    toy = ToySource(batches=4)
    result = train(toy, TrainConfig(hidden=8, epochs=5, max_steps=6))
    assert [(r.epoch, r.batches) for r in result.epochs] == [(1, 4), (2, 2)]
    assert result.epochs[0].val_acc is not None and result.epochs[1].val_acc is None
    assert result.stopped_at_max_steps and not result.stopped_early and result.to_json()["stopped_at_max_steps"]
    assert len(toy.released) == toy.handed_out  # the prefetched batch of the cut epoch went back too


def test_eval_every_skips_evaluations_but_always_evaluates_the_last_epoch():
    result = train(ToySource(), TrainConfig(hidden=8, epochs=5, eval_every=2))
    assert [r.val_acc is not None for r in result.epochs] == [False, True, False, True, True]
    assert "val -  test -" in format_epoch(result.epochs[0], 5)


@pytest.mark.parametrize("seqs, message", [([0, 1, 3], "expected seq 2 after 1, got 3 .1 batch.es. lost"),
                                           ([4, 5, 5], "expected seq 6 after 5, got 5 .a duplicate")])
def test_broken_sequence_is_an_error_and_every_batch_is_still_released(seqs, message):
    toy = ToySource(seqs=seqs)
    with pytest.raises(SequenceError, match=message):
        train(toy, TrainConfig(hidden=8, epochs=1))
    assert len(toy.released) == toy.handed_out == 3


def test_every_batch_is_released_once():
    toy = ToySource(batches=4)
    train(toy, TrainConfig(hidden=8, epochs=2))
    assert toy.handed_out == 2 * 4 + 2 * 2 * 2 and len(toy.released) == toy.handed_out


def test_metrics_count_samples_and_serve_over_http():
    metrics = TrainerMetrics()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics.serve(port)
    try:
        train(ToySource(batches=3), TrainConfig(hidden=8, epochs=2), metrics=metrics)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        metrics.close()
    assert text == generate_latest(metrics.registry).decode()
    assert "megabatch_trainer_samples_total 48.0" in text
    assert "megabatch_trainer_batch_wait_seconds_count 6.0" in text
    assert 'megabatch_trainer_build_info{device="cpu",model="sage"' in text
    assert 'megabatch_trainer_accuracy{split="val"}' in text and "megabatch_trainer_epoch 2.0" in text
    assert "megabatch_trainer_data_wait_ratio" in text and "megabatch_trainer_step_seconds_bucket" in text


def test_config_errors_name_the_field():
    with pytest.raises(UserError, match="hidden must be positive"):
        TrainConfig(hidden=0)
    with pytest.raises(UserError, match="max_steps must be positive"):
        TrainConfig(max_steps=0)
    with pytest.raises(UserError, match="resume needs a checkpoint"):
        TrainConfig(resume=True)
    with pytest.raises(UserError, match="multiple of heads"):
        TrainConfig(model="gat", hidden=30, heads=4)
