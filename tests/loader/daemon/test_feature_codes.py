"""A dataset of 8-bit feature codes (``prepare --feat-dtype uint8``) through every mode: the daemon holds and
reads codes, and every batch's ``x``, training and evaluation, is the float32 the in-memory reference decodes for
its nodes (training on codes, with a client feature cache too: tests/end_to_end/test_train_daemon.py)."""

import numpy as np
import pytest

from loader.daemon.modes import MODES
from loader.format.dataset import open_dataset
from loader.sampling.inmemory import load_in_memory
from proto.messages import EpochEnd, EvalEnd, EvalRequest, StartEpoch
from tests.daemon_harness import connect, consume, daemon_config, running_daemon, small_dataset


@pytest.fixture(scope="module")
def coded(tmp_path_factory):
    path = small_dataset(tmp_path_factory.mktemp("coded"), nodes=1500, partitions=8, feat_dtype="uint8")
    return path, load_in_memory(open_dataset(path))


@pytest.mark.parametrize("mode", list(MODES))
def test_every_batch_carries_the_decoded_values(coded, tmp_path, mode):
    path, reference = coded
    assert reference.features.dtype == np.uint8 and reference.codec is not None
    # mmap runs only with read checks off (its unchecked maps are the baseline it stands for)
    config = daemon_config(path, tmp_path / "s.sock", loader={"mode": mode}, io={"check_reads": mode != "mmap"})
    with running_daemon(config), connect(config) as client:
        assert client.welcome.dataset.feature_dtype == "float32"
        train, _ = consume(client, StartEpoch(epoch=0), EpochEnd)
        val, _ = consume(client, EvalRequest(split="val"), EvalEnd)
    assert train and val
    for _, arrays in train + val:
        assert arrays["x"].dtype == np.float32
        np.testing.assert_array_equal(arrays["x"], reference.feature_rows(arrays["n_id"]))
