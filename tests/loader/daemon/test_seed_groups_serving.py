"""``Hello.micro_batches``: the daemon groups each training batch's seeds for a trainer that cuts batches into
micro-batches (Betty's REG + METIS, off the trainer's training path)."""

import numpy as np

from tests.daemon_harness import daemon_config, running_daemon
from tests.loader.daemon.fullgraph.test_fullgraph_modes import BATCH_SIZE, FANOUTS, consume_epoch, credited_client
from tests.loader.daemon.test_aggregation_serving import consume_eval


def test_a_client_cutting_micro_batches_gets_its_training_seeds_grouped(dataset_3k, tmp_path):
    """``Hello.micro_batches``: each training batch carries its seeds' REG + METIS groups, the ones
    ``loader.sampling.seed_groups`` makes from its hop-1 edges; evaluation batches and other clients get none."""
    from loader.sampling.seed_groups import reg_groups

    config = daemon_config(dataset_3k, tmp_path / "s.sock", loader={"mode": "exact"}, memory={"budget": "512M"},
                           sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS)})
    with running_daemon(config):
        with credited_client(config, micro_batches=4) as client:
            batches = consume_epoch(client, 0)
            evaluation = consume_eval(client, "val")
        with credited_client(config) as plain:
            assert all("seed_group" not in arrays for arrays in consume_epoch(plain, 0))
    assert all("seed_group" not in arrays for arrays in evaluation)
    for arrays in batches:
        seeds = int(arrays["nodes_per_hop"][0])
        hop1 = arrays["edge_index"][:, :int(arrays["edges_per_hop"][0])]
        np.testing.assert_array_equal(arrays["seed_group"], reg_groups(hop1, seeds, 4))
        assert arrays["seed_group"].dtype == np.int32


def test_the_trainer_cuts_with_the_daemons_groups(dataset_3k, tmp_path, monkeypatch):
    """``--micro-batches K`` through a daemon: the trainer asks for groups and never runs METIS itself."""
    import trainer.micro_batches
    from trainer.daemon_source import DaemonSource
    from trainer.loop import TrainConfig, train

    def refused(*args, **kwargs):
        raise AssertionError("the trainer ran REG + METIS although the daemon sent the groups")

    monkeypatch.setattr(trainer.micro_batches, "reg_groups", refused)
    config = daemon_config(dataset_3k, tmp_path / "s.sock",
                           sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS)})
    with running_daemon(config):
        source = DaemonSource(str(config.server.socket), micro_batches=2)
        try:
            result = train(source, TrainConfig(hidden=16, epochs=1, seed=0, device="cpu", micro_batches=2),
                           log=lambda line: None)
        finally:
            source.close()
    epoch = result.epochs[0]
    assert epoch.split_batches == epoch.batches > 0 and epoch.micro_batches >= epoch.batches
