"""Issue 30: a trainer's progress against the daemon counts the batches the stream publishes. A hierarchical
epoch cuts each mega-batch's seeds into batches of their own, so it publishes more than
``train_nodes / batch_size``; the bar counted against that estimate ended at 101.7%."""

import logging
import math
import re

import pytest

from tests.daemon_harness import daemon_config, running_daemon, small_dataset
from trainer.daemon_source import DaemonSource
from trainer.loop import TrainConfig, train

STEP = re.compile(r"^epoch 1/1: step (\d+)(?:/(\d+) \((\d+)%\))?, ")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return small_dataset(tmp_path_factory.mktemp("progress-daemon"), nodes=3000, feat_dim=8, classes=3)


@pytest.mark.parametrize("passes", [1, "auto"])
def test_progress_counts_what_the_daemon_publishes(dataset, tmp_path, caplog, passes):
    config = daemon_config(dataset, tmp_path / "s.sock", hierarchy={"passes": passes})
    caplog.set_level(logging.INFO, logger="megabatch.trainer")
    with running_daemon(config):
        source = DaemonSource(str(config.server.socket))
        try:
            result = train(source, TrainConfig(hidden=8, epochs=1, device="cpu"), progress=True,
                           progress_interval=0.0, log=lambda line: None)
        finally:
            source.close()
    batches = result.epochs[0].batches
    steps = [m for m in (STEP.match(r.getMessage()) for r in caplog.records if r.name == "megabatch.trainer") if m]
    assert [int(m[1]) for m in steps] == list(range(1, batches + 1))
    if passes == 1:
        # the daemon says how many batches the epoch publishes: more than the seed count suggests
        estimate = math.ceil(source.info.train_nodes / source.info.batch_size)
        assert batches > estimate
        assert {m[2] for m in steps} == {str(batches)} and max(int(m[3]) for m in steps) == 100
    else:
        # passes chosen as the epoch goes: no total is known, so none is shown (nor a share or an ETA)
        assert all(m[2] is None for m in steps)
