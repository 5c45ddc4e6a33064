"""A training job of several ranks on one daemon, and on two daemons standing in for two machines
(client side: ``proto`` only; the trainer's DDP runs in tests/trainer/test_trainer_ddp.py)."""

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from loader.daemon.welcome import dealing_fingerprint
from loader.format.dataset import open_dataset
from loader.sampling.inmemory import eval_split_batches, split_stream
from loader.sampling.ranks import deal_epoch, deal_eval
from loader.sampling.sampling import sample_pass
from proto.client import ControlClient, JobMember
from proto.errors import RemoteError
from proto.messages import (
    BatchReady,
    Credit,
    EpochEnd,
    ErrorCode,
    EvalEnd,
    EvalRequest,
    Queued,
    Release,
    StartEpoch,
)
from tests.daemon_harness import connect, consume, daemon_config, running_daemon
from tests.loader.daemon.test_daemon import check_batch

BATCH = 64
FANOUTS = [5, 3]


def join(config, rank: int, world: int, local: int, job: str = "j") -> ControlClient:
    client = ControlClient.connect(str(config.server.socket), client=f"rank {rank}", timeout=30,
                                   job=JobMember(job, rank, world, local))
    assert client.welcome.job == job
    client.send(Credit(count=client.welcome.slots.count))
    return client


def consume_all(clients, request, end_type):
    """Each client's whole stream, the clients served at once (a job's ranks are published in lockstep)."""
    with ThreadPoolExecutor(len(clients)) as pool:
        return list(pool.map(lambda c: consume(c, request, end_type), clients))


def job_epoch(configs, epoch: int, world: int = 2, local: int = 2):
    """Every rank of a ``world``-rank job joins (``local`` per machine: rank r on ``configs[r // local]``),
    takes epoch ``epoch`` and leaves: each rank's (batches, EpochEnd)."""
    clients = [join(configs[rank // local], rank, world, local) for rank in range(world)]
    try:
        return consume_all(clients, StartEpoch(epoch=epoch), EpochEnd)
    finally:
        for client in clients:
            client.close()


def seeds_of(arrays) -> np.ndarray:
    return arrays["n_id"][:int(arrays["nodes_per_hop"][0])]


@pytest.mark.parametrize("mode, exact", [("exact", {}), ("staged", {"superbatch": 5, "feature_cache": 0}),
                                        ("hybrid", {"superbatch": 5, "feature_cache": "600K"})])
def test_the_full_graph_modes_deal_each_rank_the_in_memory_ranks_batches(dataset_3k, reference_3k, tmp_path, mode,
                                                                          exact):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", loader={"mode": mode}, fullgraph=exact)
    train = reference_3k.splits["train"]
    with running_daemon(config):
        clients = [join(config, rank, 2, 2) for rank in (0, 1)]
        try:
            for epoch in (0, 1):
                streams = consume_all(clients, StartEpoch(epoch=epoch), EpochEnd)
                for rank, (batches, end) in enumerate(streams):
                    dealt = deal_epoch(train, BATCH, 0, epoch, rank, 2)
                    assert end.batches == dealt.num_steps == len(batches)
                    for step, (ready, arrays) in enumerate(batches):
                        assert ready.batch_index == step and ready.num_batches == dealt.num_steps
                        assert ready.global_seeds == dealt.global_sizes[step]
                        np.testing.assert_array_equal(seeds_of(arrays), dealt.step_seeds(step))
                        if len(dealt.step_seeds(step)):
                            # sampled exactly as --mode inmemory samples this rank's piece
                            expected = sample_pass(reference_3k.graph, dealt.step_seeds(step), BATCH, FANOUTS,
                                                   dealt.keys[step:step + 1])
                            np.testing.assert_array_equal(arrays["n_id"], expected.nodes)
                            check_batch(arrays, reference_3k)
        finally:
            for client in clients:
                client.close()


def test_the_hierarchical_mode_deals_every_seed_once_in_equal_steps(dataset_3k, reference_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")  # hierarchical, 1 pass
    with running_daemon(config):
        streams = job_epoch([config], 0)
    (first, end0), (second, end1) = streams
    assert len(first) == len(second) == end0.batches == end1.batches
    seen = Counter()
    for (ready0, arrays0), (ready1, arrays1) in zip(first, second, strict=True):
        seeds0, seeds1 = seeds_of(arrays0), seeds_of(arrays1)
        assert ready0.batch_index == ready1.batch_index
        assert ready0.global_seeds == ready1.global_seeds == len(seeds0) + len(seeds1)
        assert len(seeds0) <= BATCH and abs(len(seeds0) - len(seeds1)) <= 1
        seen.update(seeds0.tolist() + seeds1.tolist())
        check_batch(arrays0, reference_3k)
    assert sorted(seen) == sorted(reference_3k.splits["train"].tolist())
    assert max(seen.values()) == 1


def test_each_rank_evaluates_its_share_of_the_single_process_batches(dataset_3k, reference_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    plan = eval_split_batches(reference_3k.splits["val"], 128, 0, split_stream("val"))
    with running_daemon(config):
        clients = [join(config, rank, 2, 2) for rank in (0, 1)]
        try:
            streams = [consume(client, EvalRequest(split="val"), EvalEnd) for client in clients]
        finally:
            for client in clients:
                client.close()
    for rank, (batches, _) in enumerate(streams):
        share = deal_eval(plan, 128, rank, 2)
        np.testing.assert_array_equal(np.concatenate([seeds_of(a) for _, a in batches]), share.seeds)


def test_two_daemons_deal_a_four_rank_job_as_one_machine_would(dataset_3k, reference_3k, tmp_path):
    """Two machines of two ranks each: every daemon deals only its own ranks' pieces, and the union over
    the machines is the single-process epoch, each rank with as many steps (the exact mode, to compare)."""
    configs = [daemon_config(dataset_3k, tmp_path / f"m{m}.sock", loader={"mode": "exact"}) for m in (0, 1)]
    train = reference_3k.splits["train"]
    with running_daemon(configs[0]), running_daemon(configs[1]):
        streams = job_epoch(configs, 0, world=4)
    everything = []
    for rank, (batches, _) in enumerate(streams):
        dealt = deal_epoch(train, BATCH, 0, 0, rank, 4)
        assert len(batches) == dealt.num_steps
        got = np.concatenate([seeds_of(arrays) for _, arrays in batches])
        np.testing.assert_array_equal(got, dealt.seeds)
        everything.append(got)
    assert sorted(np.concatenate(everything).tolist()) == sorted(train.tolist())


def test_a_rank_that_leaves_mid_epoch_fails_the_others_with_its_name(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config):
        survivor, leaver = join(config, 0, 2, 2), join(config, 1, 2, 2)
        leaver.send(StartEpoch(epoch=0))
        survivor.send(StartEpoch(epoch=0))
        ready = survivor.recv(timeout=60)
        assert isinstance(ready, BatchReady)
        leaver.close()
        with pytest.raises(RemoteError) as failed:
            while True:
                msg = survivor.recv(timeout=60)
                if isinstance(msg, BatchReady):
                    survivor.send(Release(slot=msg.slot, seq=msg.seq))
        survivor.close()
    assert failed.value.code == ErrorCode.JOB_FAILED
    assert "rank 1" in failed.value.message and "disconnected during epoch 0" in failed.value.message


def test_a_job_whose_ranks_do_not_all_connect_fails_within_the_job_timeout(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"job_timeout": 0.5})
    with running_daemon(config):
        alone = join(config, 0, 2, 2)
        alone.send(StartEpoch(epoch=0))
        with pytest.raises(RemoteError) as failed:
            alone.recv(timeout=60)
        alone.close()
    assert failed.value.code == ErrorCode.JOB_FAILED
    assert "1 of 2 local ranks (0) connected within 0.5 s" in failed.value.message


@pytest.mark.parametrize(("members", "fragment"), [
    ([(0, 2, 2), (0, 2, 2)], "rank 0 of job 'j' is connected already"),
    ([(0, 2, 2), (1, 3, 2)], "job 'j' has world_size 2 and local_world_size 2 here; this rank says 3 and 2"),
    ([(2, 2, 2)], "rank 2 is not below world_size 2"),
    ([(0, 8, 8)], "job 'j' has 8 ranks on this machine but the daemon serves at most 4 clients"),
    ([(0, 4, 2)], "set [hierarchy] passes to a number on every daemon"),
])
def test_a_rank_that_does_not_fit_its_job_is_refused_in_one_line(dataset_3k, tmp_path, members, fragment):
    config = daemon_config(dataset_3k, tmp_path / "s.sock",
                           hierarchy={"passes": "auto"} if members == [(0, 4, 2)] else {})
    with running_daemon(config):
        *admitted, last = members
        kept = [join(config, *member) for member in admitted]
        with pytest.raises(RemoteError) as refused:
            join(config, *last)
        for client in kept:
            client.close()
    assert refused.value.code == ErrorCode.BAD_REQUEST
    assert fragment in refused.value.message


def test_a_job_idle_between_epochs_loses_the_pipeline_to_a_waiting_trainer_and_takes_its_turn_after(
        dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"idle_timeout": 0.5})
    with running_daemon(config):
        clients = [join(config, rank, 2, 2) for rank in (0, 1)]
        consume_all(clients, StartEpoch(epoch=0), EpochEnd)
        # no StartEpoch, no evaluation: idle; a queued trainer gets the pipeline, the ranks stay connected
        with ControlClient.connect(str(config.server.socket), client="next", timeout=30, queue=True) as waiting:
            waiting.send(Credit(count=waiting.welcome.slots.count))
            batches, _ = consume_waiting(waiting, StartEpoch(epoch=0))
            assert batches
            waiting.close()
        streams = consume_all(clients, StartEpoch(epoch=1), EpochEnd)
        for client in clients:
            client.close()
    assert len(streams[0][0]) == len(streams[1][0]) > 0


def consume_waiting(client: ControlClient, start: StartEpoch):
    """``consume`` for a client that may first hear ``Queued`` notices."""
    client.send(start)
    batches = []
    while True:
        msg = client.recv(timeout=60)
        if isinstance(msg, Queued):
            continue
        if isinstance(msg, BatchReady):
            batches.append(msg)
            client.send(Release(slot=msg.slot, seq=msg.seq))
            continue
        assert isinstance(msg, EpochEnd), msg
        return batches, msg


def test_a_job_whose_ranks_all_left_between_epochs_hands_the_pipeline_on(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config):
        job_epoch([config], 0)  # and every rank leaves
        with connect(config) as alone:
            batches, _ = consume(alone, StartEpoch(epoch=1), EpochEnd)
        # the same job may come back (a restart with --resume) and train
        streams = job_epoch([config], 1)
    assert batches and len(streams[0][0]) == len(streams[1][0]) > 0


def test_the_dealing_fingerprint_follows_what_decides_the_batches_and_nothing_else(dataset_3k, tmp_path):
    opened = open_dataset(dataset_3k)

    def fingerprint(summary: str = "16 partitions, 4 per mega-batch", **tables) -> str:
        return dealing_fingerprint(opened, daemon_config(dataset_3k, tmp_path / "a.sock", **tables), summary)

    base = fingerprint()
    # where the daemon listens, what it may hold in flight and who may connect deal the same batches
    assert base == dealing_fingerprint(opened, daemon_config(dataset_3k, tmp_path / "b.sock", server={"max_clients": 2},
                                                             publisher={"slots": 5}), "16 partitions, 4 per mega-batch")
    assert fingerprint(sampler={"seed": 1}) != base
    assert fingerprint(sampler={"batch_size": 32}) != base
    assert fingerprint(hierarchy={"passes": 2}) != base
    assert fingerprint(loader={"mode": "exact"}) != base
    assert fingerprint("16 partitions, 8 per mega-batch") != base
