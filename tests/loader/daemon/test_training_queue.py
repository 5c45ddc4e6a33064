"""Independent trainers on one daemon take turns: a client that asked to queue waits for the training
pipeline, told its place; an older client is refused at once; ``megabatch status`` shows who is where."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from loader.daemon.status import format_status
from proto.client import ControlClient, JobMember
from proto.errors import RemoteError
from proto.messages import BatchReady, Credit, EpochEnd, ErrorCode, EvalEnd, EvalRequest, Queued, Release, StartEpoch
from tests.daemon_harness import connect, consume, daemon_config, running_daemon


def queued_client(config, job: JobMember | None = None) -> ControlClient:
    client = ControlClient.connect(str(config.server.socket), client="queued", timeout=30, queue=True, job=job)
    client.send(Credit(count=client.welcome.slots.count))
    return client


def drain(client: ControlClient, received: int = 0) -> list[np.ndarray]:
    """The seeds of every batch until EpochEnd, skipping the queue's notices; releases each batch
    (``received``: batches of the epoch the caller took already)."""
    seeds = []
    while True:
        msg = client.recv(timeout=60)
        if isinstance(msg, EpochEnd):
            assert msg.batches == len(seeds) + received
            return seeds
        if isinstance(msg, BatchReady):
            arrays = client.read_batch(msg).arrays
            seeds.append(np.array(arrays["n_id"][:int(arrays["nodes_per_hop"][0])]))
            client.send(Release(slot=msg.slot, seq=msg.seq))
        else:
            assert isinstance(msg, Queued), msg


def notice(client: ControlClient, position: int) -> Queued:
    """The first ``Queued`` naming ``position``: the same notice may come again meanwhile (every few
    seconds, or when the line is looked at again), never a batch before the client's turn."""
    while True:
        msg = client.recv(timeout=60)
        assert isinstance(msg, Queued), msg
        if msg.position == position:
            return msg


def place(daemon, trainer: str) -> float | None:
    return daemon.metrics.registry.get_sample_value("megabatch_training_queue_position", {"trainer": trainer})


def test_a_second_trainer_waits_its_turn_told_its_place_and_then_trains(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config) as daemon:
        first = connect(config)
        first.send(StartEpoch(epoch=0))
        ready = first.recv(timeout=60)  # session 1 holds the pipeline
        assert isinstance(ready, BatchReady)
        second, third = queued_client(config), queued_client(config)
        second.send(StartEpoch(epoch=0))
        assert second.recv(timeout=60) == Queued(position=1, holder="session 1")
        third.send(StartEpoch(epoch=0))
        assert third.recv(timeout=60) == Queued(position=2, holder="session 1")
        assert (place(daemon, "session 1"), place(daemon, "session 2"), place(daemon, "session 3")) == (0, 1, 2)
        # an older client (no queue in its Hello) is refused at once, naming the holder and the line
        with connect(config) as refused:
            refused.send(StartEpoch(epoch=0))
            with pytest.raises(RemoteError) as busy:
                refused.recv(timeout=60)
        assert busy.value.code == ErrorCode.BAD_REQUEST
        assert busy.value.message == "session 1 is training; 2 waiting; one training stream at a time"
        first.send(Release(slot=ready.slot, seq=ready.seq))
        first.close()  # its turn is over: the next in line trains, the one behind moves up
        batches = drain(second)
        assert batches
        assert notice(third, 1) == Queued(position=1, holder="session 2")
        assert (place(daemon, "session 2"), place(daemon, "session 3")) == (0, 1)
        second.close()
        rest = drain(third)  # its StartEpoch is already in
        third.close()
    assert len(rest) == len(batches)


def test_a_job_waits_behind_a_lone_trainer_and_a_waiter_that_leaves_gives_its_place_up(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config) as daemon:
        first = connect(config)
        first.send(StartEpoch(epoch=0))
        assert isinstance(first.recv(timeout=60), BatchReady)
        leaver = queued_client(config)
        leaver.send(StartEpoch(epoch=0))
        assert isinstance(leaver.recv(timeout=60), Queued)
        ranks = [queued_client(config, JobMember("j", rank, 2, 2)) for rank in (0, 1)]
        for client in ranks:
            client.send(StartEpoch(epoch=0))
        assert [client.recv(timeout=60) for client in ranks] == [Queued(2, "session 1")] * 2
        leaver.close()
        assert [notice(client, 1) for client in ranks] == [Queued(1, "session 1")] * 2
        assert place(daemon, "job 'j'") == 1
        first.close()
        with ThreadPoolExecutor(2) as pool:  # a job's ranks are published in lockstep: read them at once
            seen = list(pool.map(drain, ranks))
        for client in ranks:
            client.close()
    assert len(seen[0]) == len(seen[1]) > 0


def test_status_names_the_trainer_and_the_line():
    samples = {("megabatch_build_info", (("dataset", "d"), ("mode", "exact"), ("version", "1"))): 1.0,
               ("megabatch_training_queue_position", (("trainer", "session 4"),)): 0.0,
               ("megabatch_training_queue_position", (("trainer", "job 'h:1'"),)): 2.0,
               ("megabatch_training_queue_position", (("trainer", "session 7"),)): 1.0}
    assert "training: session 4; waiting: session 7 (1), job 'h:1' (2)" in format_status(samples).splitlines()


def test_the_holder_asking_for_its_next_epoch_keeps_its_place_while_another_waits(dataset_3k, tmp_path):
    """The deadlock of issue 27: B queued during A's epoch 0; A's StartEpoch(1) must not be queued behind B
    (which waits for A). A trains on; B trains once A leaves."""
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config):
        a, b = queued_client(config), queued_client(config)
        a.send(StartEpoch(epoch=0))
        first = a.recv(timeout=60)
        assert isinstance(first, BatchReady)  # A holds the pipeline, mid epoch 0
        b.send(StartEpoch(epoch=0))
        assert b.recv(timeout=60) == Queued(position=1, holder="session 1")
        a.send(Release(slot=first.slot, seq=first.seq))
        rest = drain(a, received=1)
        a.send(StartEpoch(epoch=1))
        assert drain(a), "the holder's next epoch must be served, not queued behind B"
        a.close()
        assert drain(b)
        b.close()
    assert rest is not None


def test_an_owner_that_only_evaluates_loses_the_pipeline_to_a_queued_trainer(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"idle_timeout": 0.5})
    with running_daemon(config) as daemon, ThreadPoolExecutor(1) as pool:
        owner, waiting = queued_client(config), queued_client(config)
        owner.send(StartEpoch(epoch=0))
        drain(owner)
        waiting.send(StartEpoch(epoch=0))
        assert waiting.recv(timeout=60) == Queued(position=1, holder="session 1")
        started = pool.submit(first_batch, waiting)
        evaluations = 0
        while not started.done():  # evaluating is not using the pipeline: it goes on after idle_timeout
            consume(owner, EvalRequest(split="val"), EvalEnd)
            evaluations += 1
        held = started.result()
        assert place(daemon, "session 2") == 0
        assert daemon.metrics.registry.get_sample_value("megabatch_training_pipeline_revoked_total") == 1
        # the owner stays connected and now waits its turn behind the trainer that holds the pipeline
        owner.send(StartEpoch(epoch=1))
        assert notice(owner, 1) == Queued(position=1, holder="session 2")
        waiting.send(Release(slot=held.slot, seq=held.seq))
        assert drain(waiting, received=1)
        waiting.close()
        assert drain(owner)
        owner.close()
    assert evaluations >= 1


def first_batch(client: ControlClient) -> BatchReady:
    """The first batch of a waiting client's epoch (kept, not released), past the queue's notices."""
    while True:
        msg = client.recv(timeout=60)
        if isinstance(msg, BatchReady):
            return msg
        assert isinstance(msg, Queued), msg
