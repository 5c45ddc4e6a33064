"""``[hierarchy] label_prior_loss``: every training batch of a mega-batch carries its class weights, under which the
mega-batch's seeds hold the epoch's label mix; evaluation batches carry none."""

import numpy as np

from loader.daemon.hierarchical.schedule import CLASS_WEIGHT_CAP
from loader.format.dataset import open_dataset
from loader.sampling.inmemory import load_in_memory
from proto.messages import EpochEnd, EvalEnd, EvalRequest, StartEpoch
from tests.daemon_harness import connect, consume, daemon_config, running_daemon


def test_each_megabatch_weighs_its_seeds_to_the_epochs_label_mix(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", hierarchy={"label_prior_loss": True,
                                                                        "megabatch_fraction": 0.25})
    data = load_in_memory(open_dataset(dataset_3k))
    train_labels = data.labels[data.splits["train"]]
    prior = np.bincount(train_labels, minlength=data.num_classes) / len(train_labels)
    with running_daemon(config), connect(config) as client:
        batches, _ = consume(client, StartEpoch(epoch=0), EpochEnd)
        evaluation, _ = consume(client, EvalRequest(split="val"), EvalEnd)
    assert all("class_weight" not in arrays for _, arrays in evaluation)
    weights = {arrays["class_weight"].tobytes() for _, arrays in batches}
    assert len(weights) > 1  # mega-batches mix labels differently: each has its own weights
    for weight_bytes in weights:
        group = [arrays for _, arrays in batches if arrays["class_weight"].tobytes() == weight_bytes]
        weight = group[0]["class_weight"]
        assert weight.dtype == np.float32 and weight.shape == (data.num_classes,)
        labels = np.concatenate([arrays["y"] for arrays in group])
        have = np.bincount(labels, minlength=data.num_classes)
        assert (weight[have == 0] == 0).all()
        if (weight[have > 0] < CLASS_WEIGHT_CAP).all() and (have > 0).all():
            np.testing.assert_allclose(have * weight / have.sum(), prior, rtol=1e-4)


def test_without_the_option_batches_carry_no_weights(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config), connect(config) as client:
        batches, _ = consume(client, StartEpoch(epoch=0), EpochEnd)
    assert all("class_weight" not in arrays for _, arrays in batches)
