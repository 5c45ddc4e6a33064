"""Several ranks training through loader daemons: one daemon serving a job's two ranks trains exactly
what DDP over the in-memory sampler trains, and two daemons serve a job of two machines (2 x 2 ranks,
gloo over loopback; each daemon stands in for one machine's)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.distributed import TCPStore

from tests.daemon_harness import daemon_config, running_daemon
from tests.trainer.test_trainer_ddp import (  # noqa: F401 - launched: a fixture
    BATCH,
    CONFIG,
    SAMPLER,
    TRAIN_NODES,
    WORLD,
    launched,
    rank_env,
)

MODEL_ARGS = ["--epochs", CONFIG["epochs"], "--hidden", CONFIG["hidden"], "--dropout", 0, "--lr", CONFIG["lr"],
              "--seed", CONFIG["seed"], "--metric", "roc_auc", "--no-progress", "--device", "cpu"]


def run_ranks(argvs: list[list[str]], world: int, local_world: int, cwd) -> list[tuple[int, str]]:
    """``python -m trainer *argvs[r]`` as rank r of ``world`` (``local_world`` per machine), all at once, over a
    rendezvous store of the test's: (exit status, stderr) of each, none left running."""
    rendezvous = TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    base = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-m", "trainer", *map(str, argv)], cwd=cwd, text=True,
                              env={**base, **rank_env(rank, rendezvous.port, world, local_world)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for rank, argv in enumerate(argvs)]
    try:
        outputs = [proc.communicate(timeout=300) for proc in ranks]
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    return [(proc.returncode, stderr) for proc, (_, stderr) in zip(ranks, outputs, strict=True)]


def exact_daemon(dataset_path, socket_path):
    """A daemon in the exact mode with the in-memory run's sampler: it deals the same pieces."""
    return daemon_config(dataset_path, socket_path, loader={"mode": "exact"},
                         sampler={"batch_size": BATCH, "fanouts": list(SAMPLER["fanouts"]),
                                  "eval_batch_size": SAMPLER["eval_batch_size"], "seed": SAMPLER["seed"]})


@pytest.fixture(scope="module")
def through_daemon(dataset_400, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-daemon")
    config = exact_daemon(dataset_400, out / "s.sock")
    args = ["--socket", config.server.socket, "--nproc-per-node", WORLD, *MODEL_ARGS,
            "--json-out", out / "result.json", "--checkpoint", out / "ck.pt"]
    with running_daemon(config):
        run = subprocess.run([sys.executable, "-m", "trainer", *map(str, args)], capture_output=True, text=True,
                             timeout=300, cwd=out)
    return run, out


def test_two_ranks_through_one_daemon_train_what_two_ranks_in_memory_train(through_daemon, launched):  # noqa: F811
    run, out = through_daemon
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "2 ranks (gloo), 25 seeds per rank and step" in run.stderr
    ours = json.loads((out / "result.json").read_text())["epochs"]
    theirs = json.loads((launched[1] / "result.json").read_text())["epochs"]
    assert [(r["samples"], r["batches"]) for r in ours] == [(TRAIN_NODES, 4)] * 2
    for mine, reference in zip(ours, theirs, strict=True):
        for key in ("loss", "train_acc", "val_acc", "test_acc", "val_score", "test_score"):
            assert mine[key] == pytest.approx(reference[key], abs=1e-5), key
    trained = torch.load(out / "ck.pt", weights_only=True)["model_state"]
    reference_state = torch.load(launched[1] / "ck.pt", weights_only=True)["model_state"]
    for name, value in reference_state.items():
        torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=0)


def test_two_daemons_serve_a_job_of_two_machines_of_two_ranks(dataset_400, tmp_path):
    configs = [exact_daemon(dataset_400, tmp_path / f"machine{m}.sock") for m in (0, 1)]
    world = 4
    argvs = [["--socket", configs[rank // 2].server.socket, *MODEL_ARGS, "--epochs", 1,
              "--json-out", tmp_path / "result.json"] for rank in range(world)]
    with running_daemon(configs[0]), running_daemon(configs[1]):
        results = run_ranks(argvs, world, 2, tmp_path)
    for returncode, stderr in results:
        assert returncode == 0, stderr
        assert "Traceback" not in stderr
    epochs = json.loads((tmp_path / "result.json").read_text())["epochs"]
    # 151 seeds in global batches of 4 x 25: two steps on every rank, every seed trained once
    assert [(r["samples"], r["batches"]) for r in epochs] == [(TRAIN_NODES, 2)]


KILL_AT_STEP = """
import os, signal, sys
from trainer import cli, daemon_source

real = daemon_source.DaemonSource.train_batches

def train_batches(self, epoch):
    for step, batch in enumerate(real(self, epoch)):
        if epoch == 2 and step == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        yield batch

daemon_source.DaemonSource.train_batches = train_batches
cli.exit_program(cli.main(sys.argv[1:]))
"""


def test_a_rank_killed_mid_epoch_fails_the_job_in_one_line_and_resume_finishes_it(dataset_400, tmp_path):
    config = exact_daemon(dataset_400, tmp_path / "s.sock")
    common = ["--socket", str(config.server.socket), *map(str, MODEL_ARGS), "--epochs", "3",
              "--checkpoint", str(tmp_path / "ck.pt"), "--json-out", str(tmp_path / "result.json"),
              "--dist-timeout", "60"]
    rendezvous = TCPStore("127.0.0.1", 0, WORLD, is_master=True, wait_for_workers=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with running_daemon(config):
        survivor = subprocess.Popen([sys.executable, "-m", "trainer", *common], cwd=tmp_path, text=True,
                                    env={**env, **rank_env(0, rendezvous.port, WORLD, WORLD)},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        killed = subprocess.Popen([sys.executable, "-c", KILL_AT_STEP, *common], cwd=tmp_path,
                                  env={**env, **rank_env(1, rendezvous.port, WORLD, WORLD)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _, stderr = survivor.communicate(timeout=300)
        finally:
            for proc in (killed, survivor):
                proc.kill()
                proc.wait()
        assert killed.returncode == -9 and survivor.returncode == 1, stderr
        errors = [line for line in stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and "Traceback" not in stderr, stderr
        # the dead rank shows either in the next all-reduce or as the daemon's job failure: one line either way
        assert errors[0].startswith("megabatch train: error: rank 0/2: "), errors
        assert "the checkpoint" in errors[0] and "holds epoch 1; resume with --resume" in errors[0], errors
        # the job is gone from the daemon with its ranks: the same job restarts from the checkpoint
        resumed = subprocess.run([sys.executable, "-m", "trainer", *common, "--resume", "--nproc-per-node",
                                  str(WORLD)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    epochs = json.loads((tmp_path / "result.json").read_text())["epochs"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3]


def test_daemons_that_would_deal_different_epochs_stop_the_job_in_one_line(dataset_400, tmp_path):
    # two "machines" whose daemons differ in the sampler seed: their ranks would train two different epochs
    configs = [daemon_config(dataset_400, tmp_path / f"m{m}.sock", loader={"mode": "exact"}, sampler={"seed": m})
               for m in (0, 1)]
    argvs = [["--socket", configs[rank].server.socket, *MODEL_ARGS] for rank in range(WORLD)]
    with running_daemon(configs[0]), running_daemon(configs[1]):
        results = run_ranks(argvs, WORLD, 1, tmp_path)
    for rank, (returncode, stderr) in enumerate(results):
        errors = [line for line in stderr.splitlines() if "error" in line]
        assert returncode == 1 and len(errors) == 1 and "Traceback" not in stderr, stderr
        assert errors[0].startswith(f"megabatch train: error: rank {rank}/2: the ranks' loader daemons deal "
                                    "different epochs (ranks 0: "), errors
