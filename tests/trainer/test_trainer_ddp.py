"""Several ranks (DDP over gloo on loopback): what they train, that their step is the global batch's, the
``--nproc-per-node`` launcher end to end, and a dead or hung rank failing the others in one line."""

import json
import os
import re
import select
import signal
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.distributed import TCPStore

from loader.sampling.inmemory import epoch_batches_inmemory
from proto.errors import UserError
from tests.graphs import DATASET_400_TRAIN_NODES
from trainer.checkpoint import Checkpoint, capture_rng, load_checkpoint, save_checkpoint
from trainer.cli import main
from trainer.inmemory_source import InMemorySource
from trainer.launch import exit_status, rank_threads
from trainer.models import build_model
from trainer.ranks import SINGLE, Ranks, ranks_from_env
from trainer.scores import roc_auc

WORLD = 2
BATCH = 25
"""Seeds per rank and step: 151 training nodes make 3 global batches of 50 and a last one of a single
seed, so rank 1's last piece is empty."""
TRAIN_NODES = DATASET_400_TRAIN_NODES
SAMPLER = {"batch_size": BATCH, "fanouts": (4, 3), "eval_batch_size": 40, "seed": 5}
CONFIG = {"hidden": 16, "lr": 0.01, "epochs": 2, "seed": 3}


def rank_env(rank: int, port: int, world: int = WORLD, local_world: int | None = None) -> dict[str, str]:
    """What torchrun (and trainer.launch) give rank ``rank`` of ``world`` whose launcher hosts the store on
    ``port``; with ``local_world``, ranks per machine (LOCAL_WORLD_SIZE; LOCAL_RANK counts within one)."""
    local = {} if local_world is None else {"LOCAL_WORLD_SIZE": str(local_world)}
    return {"RANK": str(rank), "LOCAL_RANK": str(rank % (local_world or world)), "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True", **local}


def store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, WORLD, is_master=True, wait_for_workers=False)


def test_the_ranks_sources_deal_the_single_process_epoch_between_them_once(dataset_400):
    sources = [InMemorySource(dataset_400, rank=rank, world_size=WORLD, **SAMPLER) for rank in range(WORLD)]
    train_ids = sources[0].data.splits["train"]
    orders = []
    for epoch in (1, 2):
        steps = [[batch.n_id[:batch.batch_size].tolist() for batch in source.train_batches(epoch)]
                 for source in sources]
        assert [len(s) for s in steps] == [4, 4]  # equal step counts: ceil(151 / 50)
        assert steps[1][-1] == [] and len(steps[0][-1]) == 1  # the last global batch holds one seed
        trained = [seed for rank_steps in steps for step in rank_steps for seed in step]
        single = epoch_batches_inmemory(train_ids, BATCH, SAMPLER["seed"], epoch).seeds
        assert len(trained) == len(set(trained)) == TRAIN_NODES and set(trained) == set(single.tolist())
        # the global batches are the single process's order cut in 50s
        assert steps[0][0] + steps[1][0] == single[:2 * BATCH].tolist()
        orders.append(trained)
    assert orders[0] != orders[1]  # a new order each epoch
    # every evaluation batch once, whole, round-robin
    for split in ("val", "test"):
        alone = [batch.n_id[:batch.batch_size].tolist() for batch in InMemorySource(dataset_400, **SAMPLER)
                 .eval_batches(split)]
        dealt = [[batch.n_id[:batch.batch_size].tolist() for batch in source.eval_batches(split)]
                 for source in sources]
        assert dealt == [alone[0::2], alone[1::2]]


@pytest.fixture(scope="module")
def launched(dataset_400, tmp_path_factory):
    """One ``--nproc-per-node 2`` run, two epochs, dropout 0 (deterministic), judged by ROC AUC (whose
    scores the ranks gather): (completed process, run directory)."""
    out = tmp_path_factory.mktemp("launched")
    args = ["--mode", "inmemory", "--dataset", dataset_400, "--nproc-per-node", WORLD, "--epochs", CONFIG["epochs"],
            "--hidden", CONFIG["hidden"], "--dropout", 0, "--lr", CONFIG["lr"], "--seed", CONFIG["seed"],
            "--batch-size", BATCH, "--fanouts", "4,3", "--eval-batch-size", SAMPLER["eval_batch_size"],
            "--sampler-seed", SAMPLER["seed"], "--metric", "roc_auc", "--json-out", out / "result.json",
            "--checkpoint", out / "ck.pt", "--no-progress", "--device", "cpu"]
    run = subprocess.run([sys.executable, "-m", "trainer", *map(str, args)], capture_output=True, text=True,
                         timeout=300, cwd=out)
    return run, out


def test_nproc_per_node_trains_end_to_end_and_rank_0_alone_writes(launched):
    run, out = launched
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert [line.split("  ")[0] for line in lines[:2]] == ["epoch 1/2", "epoch 2/2"], lines
    assert len(lines) == 3 and lines[2].startswith("best val auc "), lines
    # the launcher shares the cores among the ranks (trainer.launch.rank_threads) unless the user set the threads
    threads = os.environ.get("OMP_NUM_THREADS") or max(1, len(os.sched_getaffinity(0)) // 2)
    assert "Traceback" not in run.stderr
    assert f"2 ranks (gloo), 25 seeds per rank and step, {threads} threads per rank" in run.stderr
    assert run.stderr.count("metric roc_auc (as requested") == 1  # rank 0 logs, the other is quiet
    assert sorted(p.name for p in out.iterdir()) == ["ck.pt", "result.json"]
    result = json.loads((out / "result.json").read_text())
    assert [(r["samples"], r["batches"]) for r in result["epochs"]] == [(TRAIN_NODES, 4)] * 2
    checkpoint = torch.load(out / "ck.pt", weights_only=True)
    assert checkpoint["world_size"] == 2 and len(checkpoint["rank_rng"]) == 2 and checkpoint["epoch"] == 2


def test_a_ddp_step_is_the_step_of_the_accumulated_pieces(launched, dataset_400):
    # the reference: one process, the plain model, every step accumulating the gradients of both rank
    # pieces (the same sources, so the same seeds and keys) with the loop's scaling, averaged as DDP does
    torch.manual_seed(CONFIG["seed"])
    sources = [InMemorySource(dataset_400, rank=rank, world_size=WORLD, **SAMPLER) for rank in range(WORLD)]
    info = sources[0].info
    model = build_model("sage", info.num_features, CONFIG["hidden"], info.num_classes, info.num_hops, 0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=CONFIG["lr"])
    model.train()
    for epoch in range(1, CONFIG["epochs"] + 1):
        for pieces in zip(*(source.train_batches(epoch) for source in sources), strict=True):
            optimizer.zero_grad()
            for piece in pieces:
                logits = model(piece.x, piece.edge_index, piece.num_sampled_nodes, piece.num_sampled_edges)
                summed = F.cross_entropy(logits, piece.y, reduction="sum")
                (summed * WORLD / piece.global_seeds).backward()
            for param in model.parameters():
                param.grad /= WORLD
            optimizer.step()
    reference = model.state_dict()
    trained = torch.load(launched[1] / "ck.pt", weights_only=True)["model_state"]
    assert trained.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=0)


def test_the_pooled_evaluation_is_the_single_process_evaluation(launched, dataset_400):
    # the ranks' summed counts and gathered scores are those of one process evaluating every batch
    source = InMemorySource(dataset_400, **SAMPLER)
    info = source.info
    model = build_model("sage", info.num_features, CONFIG["hidden"], info.num_classes, info.num_hops, 0.0)
    model.load_state_dict(torch.load(launched[1] / "ck.pt", weights_only=True)["model_state"])
    model.eval()
    last = json.loads((launched[1] / "result.json").read_text())["epochs"][-1]
    with torch.no_grad():
        for split in ("val", "test"):
            logits = [(model(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges), b.y)
                      for b in source.eval_batches(split)]
            scores = torch.cat([torch.log_softmax(out, 1) for out, _ in logits]).numpy()
            labels = torch.cat([y for _, y in logits])
            correct = sum(int((out.argmax(1) == y).sum()) for out, y in logits)
            assert last[f"{split}_acc"] == correct / len(labels)
            assert last[f"{split}_score"] == pytest.approx(roc_auc(scores, labels.numpy()), abs=1e-12)


HOOK = """
import os, signal, sys, threading
from trainer import cli, inmemory_source

real = inmemory_source.InMemorySource.train_batches

def train_batches(self, epoch):
    for step, batch in enumerate(real(self, epoch)):
        if step == 2:
            {action}
        yield batch

inmemory_source.InMemorySource.train_batches = train_batches
cli.exit_program(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("action, why", [("os.kill(os.getpid(), signal.SIGKILL)", r"Connection (closed|reset) by peer"),
                                         ("threading.Event().wait()", "Timed out")])
def test_a_dead_or_hung_rank_fails_the_other_in_one_line_within_the_timeout(dataset_400, tmp_path, action, why):
    args = ["--mode", "inmemory", "--dataset", str(dataset_400), "--epochs", "1", "--hidden", "8",
            "--batch-size", "10", "--fanouts", "3,3", "--no-progress", "--device", "cpu", "--dist-timeout", "15"]
    rendezvous = store()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    survivor = subprocess.Popen([sys.executable, "-m", "trainer", *args], env={**env, **rank_env(0, rendezvous.port)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    failing = subprocess.Popen([sys.executable, "-c", HOOK.format(action=action), *args],
                               env={**env, **rank_env(1, rendezvous.port)}, cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _, stderr = survivor.communicate(timeout=300)
    finally:
        for proc in (failing, survivor):  # the survivor too, should it hang
            proc.kill()
            proc.wait()
    assert survivor.returncode == 1, stderr
    errors = [line for line in stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert errors[0].startswith("megabatch train: error: rank 0/2: lost the other ranks (")
    assert re.search(why, errors[0]), errors[0]
    assert "did not answer within --dist-timeout 15 s" in errors[0] and "no checkpoint was written" in errors[0]


def test_ranks_come_from_torchruns_environment():
    assert ranks_from_env({}) == SINGLE and ranks_from_env({"WORLD_SIZE": "1"}) == SINGLE
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    assert ranks_from_env(env) == Ranks(rank=3, world_size=4, local_rank=1, local_world_size=4, job="h:29500")
    assert ranks_from_env({**env, "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "run7"}) == \
        Ranks(rank=3, world_size=4, local_rank=1, local_world_size=2, job="run7")
    assert Ranks(3, 4, 1).label() == "rank 3/4" and not Ranks(3, 4, 1).main and Ranks(3, 4, 1).distributed
    with pytest.raises(UserError, match="WORLD_SIZE is 4 but MASTER_ADDR, MASTER_PORT are not set"):
        ranks_from_env({"WORLD_SIZE": "4", "RANK": "0"})
    with pytest.raises(UserError, match=r"RANK must be in \[0, 4\) for WORLD_SIZE 4, got 4"):
        ranks_from_env({**env, "RANK": "4"})
    with pytest.raises(UserError, match="WORLD_SIZE='two' is not an integer"):
        ranks_from_env({"WORLD_SIZE": "two"})
    assert (exit_status(-9), exit_status(1), exit_status(0)) == (137, 1, 0)


@pytest.mark.parametrize("env, args, fragment", [
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     ["--socket", "s", "--feature-cache", "1M"],
     "megabatch train: error: rank 0/2: --feature-cache: not with several ranks (the daemon deals one stream"),
    ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     ["--mode", "inmemory", "--dataset", "x", "--nproc-per-node", "2"],
     "megabatch train: error: rank 1/2: --nproc-per-node 2: this process is already one of 2 ranks"),
    ({"WORLD_SIZE": "3"}, ["--socket", "s"], "megabatch train: error: WORLD_SIZE is 3 but RANK, MASTER_ADDR"),
])
def test_what_several_ranks_cannot_do_is_one_line(monkeypatch, capsys, env, args, fragment):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["--no-progress", *args]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(fragment), errors


def test_the_launcher_shares_the_cores_among_the_ranks_unless_the_threads_are_set():
    assert rank_threads({}, 2, 2) == {"OMP_NUM_THREADS": "1"}
    assert rank_threads({}, 4, 16) == {"OMP_NUM_THREADS": "4"}
    assert rank_threads({}, 3, 2) == {"OMP_NUM_THREADS": "1"}  # never 0
    assert rank_threads({"OMP_NUM_THREADS": "8"}, 2, 2) == {}  # the user's choice stands


def test_a_checkpoint_keeps_every_ranks_rng_and_refuses_a_mismatch(tmp_path):
    path = tmp_path / "ck.pt"
    states = [capture_rng(), capture_rng()]
    fields = {"epoch": 1, "model_state": {}, "optimizer_state": {}, "signature": {}, "config": {}, "progress": {},
              "history": []}
    save_checkpoint(path, Checkpoint(**fields, rng=states[0], world_size=2, rank_rng=states))
    loaded = load_checkpoint(path)
    assert loaded.world_size == 2 and loaded.rank_rng is not None and len(loaded.rank_rng) == 2
    assert torch.equal(loaded.rank_rng[1]["torch"], states[1]["torch"])
    save_checkpoint(path, Checkpoint(**fields, rng=states[0]))
    assert (load_checkpoint(path).world_size, load_checkpoint(path).rank_rng) == (1, None)  # one rank, as before
    save_checkpoint(path, Checkpoint(**fields, rng=states[0], world_size=3, rank_rng=states))
    with pytest.raises(UserError, match="corrupt checkpoint .world_size 3 and its per-rank RNG states"):
        load_checkpoint(path)


ORPHAN_LAUNCHER = """
import subprocess, sys
from trainer.launch import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], preexec_fn=die_with_parent)
print(child.pid, flush=True)
child.wait()
"""


def test_a_rank_does_not_outlive_a_launcher_killed_with_sigkill():
    launcher = subprocess.Popen([sys.executable, "-c", ORPHAN_LAUNCHER], stdout=subprocess.PIPE, text=True)
    rank = int(launcher.stdout.readline())
    watch = os.pidfd_open(rank)
    ready: list[int] = []
    try:
        launcher.kill()
        launcher.wait()
        ready, _, _ = select.select([watch], [], [], 60)  # the rank's exit, not a sleep
        assert ready, f"rank {rank} still runs after its launcher was SIGKILLed"
    finally:
        if not ready:
            os.kill(rank, signal.SIGKILL)
        os.close(watch)
        launcher.stdout.close()
