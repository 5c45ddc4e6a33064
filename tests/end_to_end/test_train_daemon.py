"""The trainer against a real daemon: learns, matches the in-memory reference closely, resumes bit-for-bit."""

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from loader.format.dataset import open_dataset
from proto.messages import BatchReady, StartEpoch
from tests.daemon_harness import connect, daemon_config, running_daemon, small_dataset
from trainer.daemon_source import DaemonError, DaemonSource
from trainer.inmemory_source import InMemorySource
from trainer.loop import TrainConfig, train


@pytest.fixture(scope="module")
def accuracy_dataset(tmp_path_factory):
    """Larger than ``dataset_3k`` (4000 nodes, 32 features, 5 classes): enough signal that the daemon's and the
    in-memory trainer's accuracies can be compared after a few epochs."""
    return small_dataset(tmp_path_factory.mktemp("train-daemon"), nodes=4000, feat_dim=32, classes=5)


@pytest.mark.slow
def test_graphsage_through_the_daemon_learns_like_in_memory(accuracy_dataset, tmp_path):
    config = daemon_config(accuracy_dataset, tmp_path / "s.sock", sampler={"batch_size": 128, "fanouts": [10, 5]})
    cfg = TrainConfig(model="sage", hidden=64, epochs=4, seed=0, device="cpu")
    with running_daemon(config):
        source = DaemonSource(str(config.server.socket))
        try:
            via_daemon = train(source, cfg, log=lambda line: None)
        finally:
            source.close()
    s = config.sampler
    reference = InMemorySource(open_dataset(accuracy_dataset), batch_size=s.batch_size, fanouts=s.fanouts,
                               eval_fanouts=s.eval_fanouts, eval_batch_size=s.eval_batch_size, seed=s.seed)
    in_memory = train(reference, cfg, log=lambda line: None)
    chance = 1 / 5
    assert via_daemon.test_acc_at_best > chance + 0.3, via_daemon.summary()
    assert abs(via_daemon.test_acc_at_best - in_memory.test_acc_at_best) < 0.08, (via_daemon.summary(),
                                                                                  in_memory.summary())
    assert all(r.batches > 0 for r in via_daemon.epochs)


def test_resume_through_the_daemon_reproduces_the_uninterrupted_run(accuracy_dataset, tmp_path):
    config = daemon_config(accuracy_dataset, tmp_path / "s.sock", sampler={"batch_size": 256})
    ckpt = tmp_path / "ckpt.pt"
    with running_daemon(config):
        def run(epochs, resume, checkpoint):
            source = DaemonSource(str(config.server.socket))
            try:
                cfg = TrainConfig(model="sage", hidden=32, epochs=epochs, seed=3, device="cpu",
                                  checkpoint=checkpoint, resume=resume)
                return train(source, cfg, log=lambda line: None).model
            finally:
                source.close()

        straight = run(3, False, None)
        run(2, False, ckpt)
        resumed = run(3, True, ckpt)
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


def test_missing_daemon_is_a_clear_error(tmp_path):
    with pytest.raises(DaemonError, match="is `megabatch serve` running"):
        DaemonSource(str(tmp_path / "nobody.sock"))


class _Lines(logging.Handler):
    """Collects log lines and sets ``seen`` at the first one containing ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.INFO)
        self.text, self.lines, self.seen = text, [], threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if self.text in self.lines[-1]:
            self.seen.set()


def test_a_trainer_waits_for_the_pipeline_of_another_and_then_trains(accuracy_dataset, tmp_path):
    config = daemon_config(accuracy_dataset, tmp_path / "s.sock", sampler={"batch_size": 512})
    lines = _Lines("waiting for the loader daemon's training pipeline")
    logger = logging.getLogger("megabatch.trainer")
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        with running_daemon(config), ThreadPoolExecutor(1) as pool:
            holder = connect(config)
            holder.send(StartEpoch(epoch=0))
            assert isinstance(holder.recv(timeout=60), BatchReady)  # session 1 holds the training pipeline
            source = DaemonSource(str(config.server.socket))
            try:
                epoch = pool.submit(lambda: sum(1 for batch in source.train_batches(1) if batch.release() is None))
                assert lines.seen.wait(60), lines.lines  # the trainer waits in the queue...
                holder.close()  # ...until the holder leaves
                trained = epoch.result(timeout=120)
            finally:
                source.close()
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    assert trained > 0
    assert "waiting for the loader daemon's training pipeline: place 1 in its queue, session 1 is training" \
        in lines.lines


class _GatedSource(DaemonSource):
    """A trainer's source that, at ``where`` ("train": after epoch 0's first batch; "val": before its first
    validation), waits until ``gate`` is set: another trainer then arrives while this one holds the pipeline."""

    def __init__(self, socket_path: str, where: str, gate: threading.Event) -> None:
        super().__init__(socket_path)
        self._where, self._gate = where, gate

    def train_batches(self, epoch: int):
        for index, batch in enumerate(super().train_batches(epoch)):
            yield batch
            if self._where == "train" and epoch == 0 and index == 0:
                assert self._gate.wait(60), "the second trainer never queued"

    def eval_batches(self, split: str):
        if self._where == "val" and split == "val":
            assert self._gate.wait(60), "the second trainer never queued"
        yield from super().eval_batches(split)


@pytest.mark.parametrize("second_arrives", ["train", "val"])
def test_two_trainers_both_finish_every_epoch_whoever_arrives_while_the_other_trains_or_evaluates(
        accuracy_dataset, tmp_path, second_arrives):
    """Issue 27: the holder's next StartEpoch comes while the other trainer waits for the pipeline; it must
    not be queued behind that trainer (which waits for it)."""
    config = daemon_config(accuracy_dataset, tmp_path / "s.sock", sampler={"batch_size": 512})
    held = _Lines("takes the training pipeline")
    queued = _Lines("waiting for the loader daemon's training pipeline")
    loggers = [(logging.getLogger("megabatch.ownership"), held), (logging.getLogger("megabatch.trainer"), queued)]
    levels = [logger.level for logger, _ in loggers]
    for logger, handler in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)

    def run(source: DaemonSource, epochs: int):
        try:
            return train(source, TrainConfig(model="sage", hidden=16, epochs=epochs, seed=0, device="cpu"),
                         log=lambda line: None)
        finally:
            source.close()

    try:
        with running_daemon(config), ThreadPoolExecutor(2) as pool:
            first = pool.submit(run, _GatedSource(str(config.server.socket), second_arrives, queued.seen), 3)
            assert held.seen.wait(60), held.lines
            second = pool.submit(run, DaemonSource(str(config.server.socket)), 2)
            results = [first.result(timeout=300), second.result(timeout=300)]
    finally:
        for (logger, handler), level in zip(loggers, levels):
            logger.removeHandler(handler)
            logger.setLevel(level)
    assert [len(r.epochs) for r in results] == [3, 2]
    assert any("place 1 in its queue, session 1 is training" in line for line in queued.lines), queued.lines


@pytest.mark.parametrize("feat_dtype, mode, cache, shipped", [
    ("float16", "hierarchical", 0, "float16"), ("float16", "hierarchical", 64 << 10, "float16"),
    # 8-bit codes are decoded as the slot is written; with a client feature cache the exact mode gathers whole
    # batches into scratch first: of decoded rows
    ("uint8", "hierarchical", 0, "float32"), ("uint8", "exact", 64 << 10, "float32")])
def test_stored_feature_dtypes_train_through_the_daemon(tmp_path, feat_dtype, mode, cache, shipped):
    # float16 slots carry half the bytes and the model widens them on the training device
    dataset = small_dataset(tmp_path, nodes=1500, partitions=8, feat_dim=16, feat_dtype=feat_dtype)
    config = daemon_config(dataset, tmp_path / "s.sock", loader={"mode": mode},
                           sampler={"batch_size": 128, "fanouts": [10, 5]}, memory={"budget": "512M"})
    with running_daemon(config):
        source = DaemonSource(str(config.server.socket), feature_cache_bytes=cache)
        try:
            assert source.info.feature_dtype == shipped
            result = train(source, TrainConfig(hidden=32, epochs=2, seed=0, device="cpu"), log=lambda line: None)
        finally:
            source.close()
    assert len(result.epochs) == 2 and result.test_acc_at_best is not None
    assert np.isfinite(result.epochs[-1].loss)
    assert result.epochs[-1].loss < result.epochs[0].loss * 1.5  # finite and training, not NaN


@pytest.mark.parametrize("model, kind", [("sage", "mean"), ("gcn", "gcn")])
def test_the_aggregation_cache_through_the_daemon_trains_as_in_memory(tmp_path, model, kind):
    """The exact family's batches with ``x_agg`` are the in-memory source's with ``--aggregation-cache``: the same
    seeds train the same weights (CPU, deterministic), evaluation with the cache included."""
    from loader.offline.aggregation import build_aggregation_cache

    dataset = small_dataset(tmp_path, nodes=1500, partitions=8, feat_dim=16)
    build_aggregation_cache(dataset, kind, 1 << 20)
    config = daemon_config(dataset, tmp_path / "s.sock", loader={"mode": "exact"}, memory={"budget": "512M"},
                           sampler={"batch_size": 128, "fanouts": [10, 5], "aggregation_cache": True})
    cfg = TrainConfig(model=model, hidden=32, epochs=2, seed=0, device="cpu")
    with running_daemon(config):
        source = DaemonSource(str(config.server.socket))
        try:
            assert (source.info.aggregation, source.info.num_hops) == (kind, 2)
            via_daemon = train(source, cfg, log=lambda line: None)
        finally:
            source.close()
    s = config.sampler
    reference = InMemorySource(open_dataset(dataset), batch_size=s.batch_size, fanouts=s.fanouts,
                               eval_fanouts=s.eval_fanouts, eval_batch_size=s.eval_batch_size, seed=s.seed,
                               aggregation=True)
    in_memory = train(reference, cfg, log=lambda line: None)
    assert via_daemon.model is not None and in_memory.model is not None
    for (name, a), (_, b) in zip(via_daemon.model.state_dict().items(), in_memory.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert via_daemon.test_acc_at_best == in_memory.test_acc_at_best
