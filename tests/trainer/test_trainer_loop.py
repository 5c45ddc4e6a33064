"""The training loop: it learns, resumes bit for bit, stops early, and refuses broken input."""

import json
import logging
import math
import urllib.request
from collections.abc import Iterator

import pytest
import torch
from prometheus_client import generate_latest

from proto.errors import UserError
from tests.graphs import generated_dataset
from tests.trainer.test_scores import ref_binary_auc, ref_macro_f1
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
        self.most_held = 0
        """The most batches out and not yet released at once, counting the one being handed out."""

    @property
    def info(self) -> SourceInfo:
        return SourceInfo(num_features=4, num_classes=3, num_hops=1, batch_size=8, train_nodes=8 * self.batches,
                          description="toy")

    def _batch(self, key: int, seq: int) -> Batch:
        gen = torch.Generator().manual_seed(key)
        self.handed_out += 1
        self.most_held = max(self.most_held, self.handed_out - len(self.released))
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
    # on the CPU: CUDA's scatter aggregations add in a nondeterministic order, so there two runs agree to rounding
    cpu = {"hidden": 16, "seed": 5, "device": "cpu"}
    straight = train(source, TrainConfig(epochs=3, checkpoint=tmp_path / "a.pt", **cpu))
    train(source, TrainConfig(epochs=2, checkpoint=tmp_path / "b.pt", **cpu))
    resumed = train(source, TrainConfig(epochs=3, checkpoint=tmp_path / "b.pt", resume=True, **cpu))
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


def test_on_the_host_a_batch_is_taken_only_once_the_last_went_back():
    # a batch taken ahead would hold a second of the daemon's 2 slots through the step, and the daemon could
    # publish the next one only after it: the trainer would wait for every publish
    toy = ToySource(batches=4)
    train(toy, TrainConfig(hidden=8, epochs=2, device="cpu"))
    assert toy.most_held == 1 and len(toy.released) == toy.handed_out


def test_metrics_count_samples_and_serve_over_http():
    metrics = TrainerMetrics()
    port = metrics.serve(0)  # 0: the kernel picks a free port, and serve says which
    assert port is not None and port > 0 and metrics.port == port
    try:
        train(ToySource(batches=3), TrainConfig(hidden=8, epochs=2, device="cpu"), metrics=metrics)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        metrics.close()
    assert metrics.port is None

    def trainer_lines(exposition: str) -> list[str]:
        # process_* move between two scrapes (CPU time): compare the trainer's own series
        return [line for line in exposition.splitlines() if line.startswith("megabatch_")]

    assert trainer_lines(text) == trainer_lines(generate_latest(metrics.registry).decode())
    assert "megabatch_trainer_samples_total 48.0" in text
    wait_sum = metrics.registry.get_sample_value("megabatch_trainer_batch_wait_seconds_sum")
    assert metrics.registry.get_sample_value("megabatch_trainer_data_wait_seconds_total") == wait_sum
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_start_time_seconds"):
        assert f"\n{name} " in text, name
    assert "python_info{" in text
    assert "megabatch_trainer_batch_wait_seconds_count 6.0" in text
    assert 'megabatch_trainer_build_info{device="cpu",model="sage"' in text
    assert 'megabatch_trainer_accuracy{split="val"}' in text and "megabatch_trainer_epoch 2.0" in text
    assert 'megabatch_trainer_score{metric="accuracy",split="test"}' in text
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


# --- the metric a run is judged by (--metric) ---

class BinarySource(BatchSource):
    """Two classes; one-hop training batches of 8 seeds labelled ``train_labels``; one evaluation batch per
    split of 18 seeds whose last two are unlabelled (-1), labelled by the next entry of ``rounds[split]``."""

    def __init__(self, rounds: dict[str, list[list[int]]] | None = None,
                 train_labels: tuple[int, ...] = (1, 1, 0, 0, 0, 0, 0, -1),
                 class_counts: tuple[int, ...] | None = None) -> None:
        self.rounds = rounds or {"val": [[0, 1] * 8], "test": [[0, 1] * 8]}
        self.train_labels = train_labels
        self.class_counts = class_counts
        self.evaluations = {"val": 0, "test": 0}

    @property
    def info(self) -> SourceInfo:
        return SourceInfo(num_features=4, num_classes=2, num_hops=1, batch_size=8, train_nodes=24,
                          description="binary", train_class_counts=self.class_counts)

    @staticmethod
    def batch(key: int, labels: list[int]) -> Batch:
        n = len(labels)
        gen = torch.Generator().manual_seed(key)
        return Batch(x=torch.randn(2 * n, 4, generator=gen), y=torch.tensor(labels, dtype=torch.int64),
                     edge_index=torch.stack([torch.arange(n, 2 * n), torch.arange(n)]), n_id=torch.arange(2 * n),
                     num_sampled_nodes=[n, n], num_sampled_edges=[n])

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        for b in range(3):
            batch = self.batch(epoch * 100 + b, list(self.train_labels))
            batch.seq = b
            yield batch

    def eval_batches(self, split: str) -> Iterator[Batch]:
        rounds = self.rounds[split]
        labels = rounds[min(self.evaluations[split], len(rounds) - 1)]
        self.evaluations[split] += 1
        yield self.batch(10_000, [*labels, -1, -1])  # the same nodes every time: only the labels change


FROZEN = {"hidden": 8, "lr": 1e-12, "dropout": 0.0, "seed": 2, "device": "cpu"}  # the probe's batch is on the CPU
"""A learning rate this small moves no score: every evaluation sees the same model outputs."""


def probe_scores() -> torch.Tensor:
    """log P(class 1) of the 16 labelled evaluation nodes under the model every FROZEN run evaluates."""
    model = train(BinarySource(), TrainConfig(epochs=1, metric="accuracy", **FROZEN)).model
    assert model is not None
    batch = BinarySource.batch(10_000, [0] * 18)
    model.eval()
    with torch.no_grad():
        logits = model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
    return torch.log_softmax(logits, 1)[:16, 1]


def disagreeing_rounds(scores: torch.Tensor) -> tuple[list[int], list[int]]:
    """Labels for the 16 nodes: ``by_acc`` has the better accuracy, ``by_auc`` the better ROC AUC.

    by_acc: the model's own predictions (the top k scores), except the lowest score made positive
    and the highest negative (2 errors at most, AUC < 1). by_auc: the top m scores positive, with
    |m - k| = 3 (3 errors, AUC exactly 1).
    """
    order = torch.argsort(scores).tolist()
    k = int((scores > math.log(0.5)).sum())
    by_acc = [int(s > math.log(0.5)) for s in scores.tolist()]
    by_acc[order[0]], by_acc[order[-1]] = 1, 0
    m = k + 3 if k <= 12 else k - 3
    by_auc = [0] * 16
    for node in order[16 - m:]:
        by_auc[node] = 1
    return by_acc, by_auc


def test_best_epoch_and_patience_follow_the_chosen_metric_and_scores_are_right():
    scores = probe_scores()
    assert len(set(scores.tolist())) == 16  # distinct scores: the rounds below rank as designed
    by_acc, by_auc = disagreeing_rounds(scores)
    values = scores.tolist()
    predicted = [int(s > math.log(0.5)) for s in values]
    expected = {}
    for name, labels in (("by_acc", by_acc), ("by_auc", by_auc)):
        acc = sum(p == y for p, y in zip(predicted, labels, strict=True)) / 16
        expected[name] = {"accuracy": acc, "roc_auc": ref_binary_auc(values, [y == 1 for y in labels]),
                          "macro_f1": ref_macro_f1(predicted, labels)}
    assert expected["by_acc"]["accuracy"] > expected["by_auc"]["accuracy"]
    assert expected["by_acc"]["roc_auc"] < expected["by_auc"]["roc_auc"] == 1.0

    val = [by_acc, by_auc, by_acc, by_acc, by_acc]
    test = [by_auc, by_acc, by_auc, by_acc, by_auc]
    names = [["by_acc", "by_auc", "by_acc", "by_acc", "by_acc"], ["by_auc", "by_acc", "by_auc", "by_acc", "by_auc"]]
    metrics = TrainerMetrics()
    lines: list[str] = []
    auc = train(BinarySource({"val": val, "test": test}), TrainConfig(epochs=5, patience=2, metric="roc_auc", **FROZEN),
                metrics=metrics, log=lines.append)
    # by AUC, epoch 2 is best and epochs 3 and 4 are the two without progress
    assert [r.epoch for r in auc.epochs] == [1, 2, 3, 4] and auc.stopped_early and auc.best_epoch == 2
    for i, record in enumerate(auc.epochs):
        want_val, want_test = expected[names[0][i]], expected[names[1][i]]
        assert (record.val_acc, record.val_score) == (want_val["accuracy"], want_val["roc_auc"])
        assert (record.test_acc, record.test_score) == (want_test["accuracy"], want_test["roc_auc"])
        assert f"val auc {record.val_score:.3f} acc {record.val_acc:.3f}  test auc " in lines[i]
    assert (auc.best_val_score, auc.best_val_acc) == (1.0, expected["by_auc"]["accuracy"])
    assert (auc.test_score_at_best, auc.test_acc_at_best) == (expected["by_acc"]["roc_auc"],
                                                              expected["by_acc"]["accuracy"])
    assert auc.summary().startswith("best val auc 1.0000 at epoch 2: test auc ")
    sample = metrics.registry.get_sample_value
    assert sample("megabatch_trainer_score", {"split": "val", "metric": "roc_auc"}) == auc.epochs[-1].val_score
    assert sample("megabatch_trainer_accuracy", {"split": "val"}) == auc.epochs[-1].val_acc

    acc = train(BinarySource({"val": val, "test": test}), TrainConfig(epochs=5, patience=2, metric="accuracy",
                                                                       **FROZEN))
    # by accuracy, epoch 1 is best; epoch 3 only ties it, so epochs 2 and 3 are the two without progress
    assert [r.epoch for r in acc.epochs] == [1, 2, 3] and acc.best_epoch == 1
    assert acc.best_val_score == acc.best_val_acc == expected["by_acc"]["accuracy"]

    f1 = train(BinarySource({"val": val, "test": test}), TrainConfig(epochs=2, metric="macro_f1", **FROZEN))
    assert [r.val_score for r in f1.epochs] == pytest.approx([expected["by_acc"]["macro_f1"],
                                                              expected["by_auc"]["macro_f1"]], abs=1e-12)


def test_auto_counts_the_first_epochs_training_labels_when_the_source_has_no_class_counts(caplog):
    caplog.set_level(logging.INFO, logger="megabatch.trainer")
    # 2 positives among the 7 labelled seeds of each batch (the eighth is -1): 28.6% < 35%
    result = train(BinarySource(), TrainConfig(hidden=8, epochs=1))
    assert result.metric == "roc_auc" and result.epochs[0].val_score is not None
    why = "minority class 1 is 28.6% of 21 labelled training nodes, under 35%; counted in the training batches of " \
          "epoch 1"
    assert result.metric_reason is not None and why in result.metric_reason
    assert f"metric roc_auc (auto: binary task, {why})" in caplog.text
    balanced = train(BinarySource(train_labels=(1, 1, 1, 0, 0, 0, 0, -1)), TrainConfig(hidden=8, epochs=1))
    assert balanced.metric == "accuracy" and "42.9% of 21" in str(balanced.metric_reason)


def test_auto_uses_the_sources_class_counts_when_it_has_them():
    # the batches are imbalanced, the source's counts are not: the counts decide, before any batch
    result = train(BinarySource(class_counts=(50, 50)), TrainConfig(hidden=8, epochs=1))
    assert result.metric == "accuracy"
    assert str(result.metric_reason).endswith("50.0% of 100 labelled training nodes, not under 35%; from the "
                                              "source's training labels")
    assert train(BinarySource(class_counts=(10, 90)), TrainConfig(hidden=8, epochs=1)).metric == "roc_auc"
    multi = train(ToySource(), TrainConfig(hidden=8, epochs=1))
    assert multi.metric == "accuracy" and multi.metric_reason == "auto: 3 classes, not a binary task"


def test_inmemory_source_knows_the_class_counts_of_its_training_labels(source):
    labels = source.data.labels[source.data.splits["train"]]
    counts = source.info.train_class_counts
    assert counts is not None and len(counts) == 4 and sum(counts) == int((labels >= 0).sum())
    assert all(counts[c] == int((labels == c).sum()) for c in range(4))


def test_json_keeps_the_accuracy_keys_and_adds_the_scores():
    result = train(ToySource(), TrainConfig(hidden=8, epochs=3, metric="macro_f1"))
    data = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert {"config", "device", "source", "epochs", "best_epoch", "best_val_acc", "test_acc_at_best", "stopped_early",
            "stopped_at_max_steps", "resumed_from_epoch", "metric", "best_val_score",
            "test_score_at_best"} <= data.keys()
    assert data["metric"] == "macro_f1" and data["config"]["metric"] == "macro_f1"
    epochs = data["epochs"]
    assert all({"val_acc", "test_acc", "val_score", "test_score"} <= e.keys() for e in epochs)
    best = epochs[data["best_epoch"] - 1]
    assert data["best_val_score"] == best["val_score"] == max(e["val_score"] for e in epochs)
    assert (data["best_val_acc"], data["test_acc_at_best"], data["test_score_at_best"]) == (
        best["val_acc"], best["test_acc"], best["test_score"])


def test_an_undefined_score_is_null_in_json_and_never_the_best():
    # every val label is 0: ROC AUC is undefined there
    result = train(BinarySource({"val": [[0] * 16], "test": [[0, 1] * 8]}),
                   TrainConfig(hidden=8, epochs=2, metric="roc_auc"))
    assert all(math.isnan(r.val_score) for r in result.epochs if r.val_score is not None)
    assert result.best_epoch is None and result.summary() == "no evaluation gave a defined val roc_auc"
    data = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert [e["val_score"] for e in data["epochs"]] == [None, None] and data["best_val_score"] is None
    assert all(0.0 <= e["test_score"] <= 1.0 for e in data["epochs"])


def test_resume_refuses_another_metric_and_auto_keeps_the_checkpoints(tmp_path):
    path = tmp_path / "ck.pt"
    frozen = {"hidden": 8, "lr": 1e-12}  # epoch 2 only ties epoch 1: the best stays the checkpointed one
    train(ToySource(), TrainConfig(epochs=1, metric="macro_f1", checkpoint=path, **frozen))
    for other in ("accuracy", "roc_auc"):
        with pytest.raises(UserError, match=f"judged by macro_f1, not {other} .resume with --metric macro_f1 or "
                                            "auto"):
            train(ToySource(), TrainConfig(epochs=2, metric=other, checkpoint=path, resume=True, **frozen))
    resumed = train(ToySource(), TrainConfig(epochs=2, checkpoint=path, resume=True, **frozen))
    assert resumed.metric == "macro_f1" and str(resumed.metric_reason).startswith("as in the checkpoint; as requested")
    straight = train(ToySource(), TrainConfig(epochs=2, metric="macro_f1", **frozen))
    assert straight.best_epoch == resumed.best_epoch == 1
    assert (straight.best_val_score, straight.test_score_at_best, straight.best_val_acc, straight.test_acc_at_best) == (
        resumed.best_val_score, resumed.test_score_at_best, resumed.best_val_acc, resumed.test_acc_at_best)
    assert straight.best_val_score != straight.best_val_acc  # macro F1 and accuracy differ here: a real check


def test_a_checkpoint_from_before_metrics_means_accuracy(tmp_path):
    path = tmp_path / "ck.pt"
    train(ToySource(), TrainConfig(hidden=8, epochs=1, metric="accuracy", checkpoint=path))
    old = torch.load(path, weights_only=True)
    del old["metric"]  # what the previous trainer wrote: no metric, no scores
    for key in ("best_val_acc", "best_test_score", "metric_reason"):
        del old["progress"][key]
    for record in old["history"]:
        del record["val_score"], record["test_score"]
    torch.save(old, path)
    with pytest.raises(UserError, match="judged by accuracy, not roc_auc"):
        train(ToySource(), TrainConfig(hidden=8, epochs=2, metric="roc_auc", checkpoint=path, resume=True))
    resumed = train(ToySource(), TrainConfig(hidden=8, epochs=2, checkpoint=path, resume=True))
    assert resumed.metric == "accuracy" and "written before checkpoints recorded a metric" in str(resumed.metric_reason)
    first = resumed.epochs[0]
    assert first.val_acc is not None and first.val_score == first.val_acc and first.test_score == first.test_acc
    assert resumed.best_val_score is not None and resumed.best_val_acc is not None


def test_metric_is_validated_and_named():
    with pytest.raises(UserError, match="metric must be one of auto, accuracy, roc_auc, macro_f1, got 'f1'"):
        TrainConfig(metric="f1")


def test_class_weights_weigh_each_seeds_loss_and_divide_by_the_seeds():
    """``Batch.class_weight`` (the daemon's label_prior_loss): the step follows sum_i w[y_i] l_i / n, not
    PyTorch's weighted mean (which divides by the weights' sum); weights of 1 train exactly as none."""
    import torch.nn.functional as F

    from trainer.loop import _Run
    from trainer.ranks import SINGLE

    logits = torch.randn(8, 3)
    y = torch.tensor([0, 1, 2, 2, 1, 0, 0, -1])
    weight = torch.tensor([0.5, 2.0, 1.0])
    batch = Batch(x=torch.zeros(8, 4), y=y, edge_index=torch.zeros((2, 0), dtype=torch.long), n_id=torch.arange(8),
                  num_sampled_nodes=[8], num_sampled_edges=[], class_weight=weight)
    run = _Run.__new__(_Run)
    run.ranks = SINGLE
    loss, _ = run.loss(logits, batch)
    per_seed = F.cross_entropy(logits, y, ignore_index=-1, reduction="none")
    labelled = y >= 0
    want = (per_seed[labelled] * weight[y[labelled]]).sum() / int(labelled.sum())
    assert torch.allclose(loss, want)
    ones = Batch(x=batch.x, y=y, edge_index=batch.edge_index, n_id=batch.n_id, num_sampled_nodes=[8],
                 num_sampled_edges=[], class_weight=torch.ones(3))
    plain = Batch(x=batch.x, y=y, edge_index=batch.edge_index, n_id=batch.n_id, num_sampled_nodes=[8],
                  num_sampled_edges=[])
    assert torch.allclose(run.loss(logits, ones)[0], run.loss(logits, plain)[0])
