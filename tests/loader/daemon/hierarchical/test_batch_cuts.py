"""The hierarchical mode cuts each mega-batch's seeds into nearly equal batches (``even_batch_size``): as many
steps as the plain cut at ``batch_size``, none of them a short remainder."""

import itertools

from proto.messages import EpochEnd, StartEpoch
from tests.daemon_harness import connect, consume, daemon_config, running_daemon

BATCH = 64


def test_each_megabatch_is_cut_into_nearly_equal_batches(dataset_3k, tmp_path):
    # the label-prior weights differ from one mega-batch to the next: they mark where each one's batches begin
    config = daemon_config(dataset_3k, tmp_path / "s.sock", sampler={"batch_size": BATCH},
                           hierarchy={"label_prior_loss": True, "megabatch_fraction": 0.25})
    with running_daemon(config), connect(config) as client:
        batches, _ = consume(client, StartEpoch(epoch=0), EpochEnd)
    groups = [[len(arrays["y"]) for _, arrays in run]
              for _, run in itertools.groupby(batches, key=lambda b: b[1]["class_weight"].tobytes())]
    assert len(groups) == 4
    for sizes in groups:
        seeds, steps = sum(sizes), len(sizes)
        assert steps == -(-seeds // BATCH)  # the plain cut's step count
        even = -(-seeds // steps)
        assert sizes[:-1] == [even] * (steps - 1) and even - steps < sizes[-1] <= even, sizes
    # the plain cut would have left a remainder batch in some mega-batch: the test sees the evening
    assert any(sum(sizes) % BATCH and sum(sizes) % BATCH < min(sizes) for sizes in groups)
