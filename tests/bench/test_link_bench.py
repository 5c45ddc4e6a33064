"""bench/link_bench.py: its runs' commands and names, and the report from the trainer's JSON."""

import json
import math
import subprocess
import tomllib
from pathlib import Path

import pytest

from bench import link_bench
from bench.harness import code_version
from bench.link_bench import (
    code_markdown,
    daemon_config,
    dataset_markdown,
    parse_args,
    read_run,
    run_code,
    run_stem,
    summarize,
    train_command,
    trajectory,
    trajectory_markdown,
)
from trainer.link.options import DEFAULT_BUFFER_LR, DEFAULT_LINK_LR

LR, BUFFER_LR = f"lr{DEFAULT_LINK_LR}", f"lr{DEFAULT_BUFFER_LR}"
"""The link task's default lrs (shuffled, buffer orders), in a run's name (only the old runs' 0.003 goes unnamed)."""


def result(best: int, val: list[float], test_mrr: float, loads: int | None) -> dict:
    """A trainer ``--json-out`` as the link task writes it, the fields the bench reads."""
    epochs = [{"epoch": e + 1, "val": {"mrr": v}, "train_s": 2.0, "eval_s": 0.5,
               "buffer_states": None if loads is None else 5, "partition_loads": loads} for e, v in enumerate(val)]
    return {"epochs": epochs, "best_epoch": best, "best_val": {"mrr": val[best - 1]},
            "test_at_best": {"mrr": test_mrr, "hits@10": 0.8, "roc_auc": None}}


def test_defaults_and_commands():
    args = parse_args([])
    assert (args.partitions, args.buffer_partitions, args.seeds, args.max_epochs, args.patience, args.batch_size) == \
        (32, 8, [0, 1, 2], 100, 10, 256)
    assert args.datasets == ["cora-planetoid", "citeseer-planetoid", "amazon-photo"]
    out = Path("/o.json")
    shuffled = train_command(Path("/ds"), "shuffled", 1, out, args)
    assert "--link-order" not in shuffled and "--buffer-partitions" not in shuffled
    assert shuffled[shuffled.index("--decoder") + 1] == "mlp" and shuffled[shuffled.index("--hidden") + 1] == "128"
    assert shuffled[shuffled.index("--sampler-seed") + 1] == shuffled[shuffled.index("--seed") + 1] == "1"
    comet = train_command(Path("/ds"), "comet", 1, out, parse_args(["--logical-partitions", "16"]))
    assert comet[-6:] == ["--link-order", "comet", "--buffer-partitions", "8", "--logical-partitions", "16"]
    beta = train_command(Path("/ds"), "beta", 1, out, parse_args(["--logical-partitions", "16"]))
    assert beta[-4:] == ["--link-order", "beta", "--buffer-partitions", "8"]  # BETA takes no logical partitions
    # the buffer orders as MariusGNN has them: the trainer's negative weights off
    plain = train_command(Path("/ds"), "beta-unweighted", 1, out, args)
    assert plain[-5:] == ["--link-order", "beta", "--buffer-partitions", "8", "--no-negative-weights"]
    assert train_command(Path("/ds"), "comet-unweighted", 1, out, args)[-5:] == [
        "--link-order", "comet", "--buffer-partitions", "8", "--no-negative-weights"]
    # MariusGNN's whole buckets: the trainer's option, its negatives weighted as the product's
    assert train_command(Path("/ds"), "comet-bucket-assignment", 1, out, args)[-6:] == [
        "--link-order", "comet", "--buffer-partitions", "8", "--link-assignment", "bucket"]
    daemon = train_command(Path("/ds"), "daemon", 1, out, args, Path("/s.sock"))
    assert daemon[daemon.index("--socket") + 1] == "/s.sock" and "--dataset" not in daemon
    assert "--sampler-seed" not in daemon and "--link-order" not in daemon  # the daemon's config sets the sampler
    config = tomllib.loads(daemon_config(Path("/ds"), Path("/s.sock"), 1, args))
    assert config["loader"]["mode"] == "exact" and config["sampler"] == {
        "batch_size": 256, "fanouts": [10, 5], "eval_fanouts": [10, 5], "seed": 1}
    # the names tell settings apart, so --reuse never takes another setting's run
    names = {run_stem("cora", order, 0, parse_args(extra)) for order in ("shuffled", "comet", "beta")
             for extra in ([], ["--buffer-partitions", "4"], ["--logical-partitions", "16"])}
    # shuffled does not depend on the buffer, nor beta on L: 1 + 3 + 2
    assert names == {f"cora-p32-{run}-b256-{BUFFER_LR if run != 'shuffled' else LR}-ema0.99-seed0" for run in (
        "shuffled", "comet-c8-edges", "comet-c4-edges", "comet-c8-l16-edges", "beta-c8", "beta-c4")}
    # COMET's runs since it splits buckets among states are named so; its runs before were bucket assignment's
    assert run_stem("cora", "comet-bucket-assignment", 0, args) == \
        f"cora-p32-comet-bucket-assignment-c8-b256-{BUFFER_LR}-ema0.99-seed0"
    # a run of other epochs, patience or fanouts is another run (a 2-epoch smoke run is no 100-epoch run)
    smoke = parse_args(["--max-epochs", "2", "--patience", "5", "--fanouts", "5,5", "--ema", "0"])
    assert run_stem("cora", "shuffled", 0, smoke) == f"cora-p32-shuffled-b256-f5_5-e2-pat5-{LR}-seed0"
    # the trainer's moving average of the weights (its default) is named: the runs before it evaluated the last ones
    assert run_stem("cora", "shuffled", 0, args) == f"cora-p32-shuffled-b256-{LR}-ema0.99-seed0"
    assert shuffled[shuffled.index("--ema") + 1] == "0.99"
    # and so is the learning rate, which every order's command passes: by default the trainer's for the order (a
    # buffer order's own), named; only the lr of the runs named before it was (0.003) goes unnamed
    assert shuffled[shuffled.index("--lr") + 1] == str(DEFAULT_LINK_LR)
    assert daemon[daemon.index("--lr") + 1] == str(DEFAULT_LINK_LR)
    assert plain[plain.index("--lr") + 1] == str(DEFAULT_BUFFER_LR)  # beta
    fast = parse_args(["--lr", "0.01"])
    assert run_stem("cora", "comet", 0, fast) == "cora-p32-comet-c8-edges-b256-lr0.01-ema0.99-seed0"
    assert run_stem("cora", "shuffled", 0, parse_args(["--lr", "0.003"])) == "cora-p32-shuffled-b256-ema0.99-seed0"
    comet = train_command(Path("/ds"), "comet", 1, out, fast)
    assert comet[comet.index("--lr") + 1] == "0.01"
    random = parse_args(["--partitioner", "random"])
    assert run_stem("cora", "comet", 0, random) == f"cora-p32-random-comet-c8-edges-b256-{BUFFER_LR}-ema0.99-seed0"


@pytest.mark.parametrize("argv, message", [(["--orders", "comet,marius"], "unknown marius"),
                                           (["--buffer-partitions", "32"], "need 2 <= C < --partitions 32"),
                                           (["--lr", "0"], "--lr 0.0: need a positive number")])
def test_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_report_compares_with_shuffled():
    runs = {"shuffled": [read_run("shuffled", 0, result(2, [0.30, 0.50, 0.45], 0.48, None)),
                         read_run("shuffled", 1, result(3, [0.20, 0.40, 0.52], 0.50, None))],
            "comet": [read_run("comet", 0, result(3, [0.10, 0.30, 0.50], 0.46, 100)),
                      read_run("comet", 1, result(2, [0.10, 0.40, 0.30], 0.40, 120))]}
    target, (shuffled, comet) = summarize(runs)
    assert target == pytest.approx(0.50)  # the mean best validation MRR, 0.51, minus 1 point
    assert shuffled.epochs_to_target == [2, 3] and comet.epochs_to_target == [3, None]
    assert shuffled.seconds_to_target == [5.0, 7.5] and comet.seconds_to_target == [7.5, None]  # 2.5 s an epoch
    assert shuffled.loads_per_epoch is None and comet.loads_per_epoch == pytest.approx(110)
    assert comet.states_per_epoch == 5 and comet.train_s_per_epoch == 2.0 and math.isnan(comet.auc[0])
    text = dataset_markdown("g", target, [shuffled, comet], "buffer of C = 8 of 32 partitions")
    rows = {line.split(" | ")[0]: line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    assert rows["| comet"][1] == "0.4300 (0.460, 0.400)"
    assert rows["| comet"][2] == "-6.0 ± 4.0"  # seed by seed: -2 and -10
    assert rows["| comet"][7] == "3.0 (1 never)" and rows["| comet"][8] == "8 (1 never)"
    assert rows["| comet"][10] == "110.0" and rows["| shuffled"][8] == "6"
    assert rows["| shuffled"][2] == "-" and rows["| shuffled"][10] == "-"


def test_the_report_follows_the_gap_over_training():
    runs = {"shuffled": [read_run("shuffled", 0, result(2, [0.30, 0.50, 0.45, 0.40, 0.44], 0.48, None)),
                         read_run("shuffled", 1, result(3, [0.20, 0.40, 0.52], 0.50, None))],  # stopped early
            "comet": [read_run("comet", 0, result(3, [0.10, 0.30, 0.50, 0.55, 0.56], 0.46, 100)),
                      read_run("comet", 1, result(2, [0.10, 0.40, 0.30, 0.35, 0.38], 0.40, 120))]}
    curves = {order: [(e, round(v, 9)) for e, v in points] for order, points in trajectory(runs, every=2).items()}
    # best so far, mean of the seeds, at epochs 2 and 4 and the last; the early-stopped run keeps its best (0.52)
    assert curves["shuffled"] == [(2, 0.45), (4, 0.51), (5, 0.51)]
    assert curves["comet"] == [(2, 0.35), (4, 0.475), (5, 0.48)]
    rows = [line.split(" | ") for line in trajectory_markdown(curves).splitlines() if line.startswith("| ")]
    assert rows[0] == ["| after epoch", "shuffled", "comet", "comet - shuffled |"]
    assert [row[-1] for row in rows[1:]] == ["-10.0 |", "-3.5 |", "-3.0 |"]
    assert trajectory({"comet": runs["comet"]}, every=2)["comet"][0][0] == 2
    assert "- shuffled" not in trajectory_markdown(trajectory({"comet": runs["comet"]}, every=2))


def test_a_run_cut_short_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    dirs = {key: tmp_path / key for key in ("work", "runs", "logs")}
    for path in dirs.values():
        path.mkdir()
    commands: list[list[str]] = []

    def trainer(command, **_):  # a trainer that checkpoints, then dies on its first run and finishes on its second
        commands.append(command)
        Path(command[command.index("--checkpoint") + 1]).write_text("epoch")
        if len(commands) == 1:
            return subprocess.CompletedProcess(command, -9)
        Path(command[command.index("--json-out") + 1]).write_text(json.dumps(result(2, [0.3, 0.5], 0.48, None)))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(link_bench.subprocess, "run", trainer)
    versions = iter(["c0ffee", "beef00", "f00d00"])
    monkeypatch.setattr(link_bench, "code_version", lambda: next(versions))
    args = parse_args(["--reuse"])
    checkpoint = dirs["runs"] / (run_stem("cora", "shuffled", 0, args) + ".ckpt")
    with pytest.raises(SystemExit, match="exit -9"):
        link_bench.one_run("cora", Path("/ds"), "shuffled", 0, dirs, args)
    assert "--resume" not in commands[0] and checkpoint.exists()  # the last whole epoch is kept
    run = link_bench.one_run("cora", Path("/ds"), "shuffled", 0, dirs, args)
    assert commands[1][-3:] == ["--checkpoint", str(checkpoint), "--resume"] and run.best_epoch == 2
    # a finished run leaves its result, and its last checkpoint under another name (for a longer cap to continue)
    assert not checkpoint.exists() and checkpoint.with_suffix(".last.ckpt").read_text() == "epoch"
    assert run.code == ("c0ffee", "beef00")  # the code of each launch: resumed after a commit
    assert link_bench.one_run("cora", Path("/ds"), "shuffled", 0, dirs, args).code == ("c0ffee", "beef00")  # reused
    # without --reuse a run starts over: an old checkpoint is not resumed
    checkpoint.write_text("stale")
    run = link_bench.one_run("cora", Path("/ds"), "shuffled", 0, dirs, parse_args([]))
    assert "--resume" not in commands[2] and not checkpoint.exists()
    assert run.code == ("f00d00",)


def test_a_longer_cap_continues_the_shorter_caps_runs(tmp_path, monkeypatch):
    dirs = {key: tmp_path / key for key in ("work", "runs", "logs")}
    for path in dirs.values():
        path.mkdir()
    commands: list[list[str]] = []

    def trainer(command, **_):  # checkpoints "epoch N" and stops early on seed 1 only
        commands.append(command)
        epochs, seed = command[command.index("--epochs") + 1], int(command[command.index("--seed") + 1])
        Path(command[command.index("--checkpoint") + 1]).write_text(f"epoch {epochs}")
        data = result(2, [0.3, 0.5], 0.48, None) | {"stopped_early": seed == 1}
        Path(command[command.index("--json-out") + 1]).write_text(json.dumps(data))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(link_bench.subprocess, "run", trainer)
    monkeypatch.setattr(link_bench, "code_version", lambda: "c0ffee")
    short, long = parse_args(["--reuse", "--max-epochs", "3"]), parse_args(["--reuse", "--max-epochs", "8"])
    for seed in (0, 1):
        link_bench.one_run("cora", Path("/ds"), "shuffled", seed, dirs, short)
    assert link_bench.shorter_run("cora", "shuffled", 0, dirs, long) == (run_stem("cora", "shuffled", 0, short), False)
    assert link_bench.shorter_run("cora", "shuffled", 1, dirs, long) == (run_stem("cora", "shuffled", 1, short), True)
    assert link_bench.shorter_run("cora", "shuffled", 2, dirs, long) is None
    assert link_bench.shorter_run("cora", "comet", 0, dirs, long) is None  # another setting's runs are not this run's

    run = link_bench.one_run("cora", Path("/ds"), "shuffled", 0, dirs, long)  # ran to its cap: continued
    checkpoint = dirs["runs"] / (run_stem("cora", "shuffled", 0, long) + ".ckpt")
    assert commands[2][-3:] == ["--checkpoint", str(checkpoint), "--resume"] and "8" in commands[2]
    assert run.code == ("c0ffee",) and run.best_epoch == 2
    assert checkpoint.with_suffix(".last.ckpt").read_text() == "epoch 8"
    link_bench.one_run("cora", Path("/ds"), "shuffled", 1, dirs, long)  # stopped early: its result is the run's
    assert len(commands) == 3 and (dirs["runs"] / (run_stem("cora", "shuffled", 1, long) + ".json")).exists()
    # without --reuse nothing is continued
    link_bench.one_run("cora", Path("/ds"), "shuffled", 0, dirs, parse_args(["--max-epochs", "9"]))
    assert "--resume" not in commands[3]


def test_the_report_says_which_code_trained_the_runs():
    assert run_code([]) == ("unknown",)  # a run from before the bench recorded launches
    assert run_code([{"commit": "a", "resumed": False}, {"commit": "a", "resumed": True}]) == ("a",)
    assert run_code([{"commit": "b", "resumed": True}]) == ("unknown", "b")  # resumed from an unrecorded launch
    one = {"shuffled": [read_run("shuffled", 0, result(2, [0.3, 0.5], 0.48, None), ("a",))],
           "comet": [read_run("comet", 0, result(2, [0.3, 0.5], 0.48, 5), ("a",))]}
    assert code_markdown(one) == "Code: every run at `a`.\n"
    mixed = {**one, "beta": [read_run("beta", 1, result(2, [0.3, 0.5], 0.48, 5), ("unknown", "b"))]}
    text = code_markdown(mixed)
    assert text.startswith("Code: the runs were trained by more than one version (")
    assert "shuffled seed 0: `a`" in text and "beta seed 1: `unknown` then `b`" in text


def test_code_version_names_the_commit_or_says_unknown(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    assert code_version(repo) == "unknown"  # not a git checkout
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    (repo / "f").write_text("1")
    subprocess.run(git + ["add", "f"], check=True)
    subprocess.run(git + ["commit", "-qm", "c"], check=True)
    head = subprocess.run(git + ["rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert code_version(repo) == head
    (repo / "f").write_text("2")  # a tracked file changed: the run's code is not the commit's
    assert code_version(repo) == head + "+dirty"
    (repo / "f").write_text("1")
    (repo / "untracked").write_text("x")  # untracked files (results, logs) do not count
    assert code_version(repo) == head
