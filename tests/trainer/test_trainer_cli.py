"""``python -m trainer`` (megabatch train) end to end: epoch lines, JSON result, one-line errors."""

import json
import re
import subprocess
import sys

import pytest

from loader.format.dataset import open_dataset
from trainer.cli import build_parser, main, resolve_sampler

EPOCH_LINE = re.compile(r"^epoch (\d+)/2  loss \d+\.\d{3}  train \d\.\d{3}  val \d\.\d{3}  test \d\.\d{3}  "
                        r"\d+ samples/s  data-wait \d+\.\d%$")


def trainer(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "trainer", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def in_process(capsys, *args):
    """``main`` in this process (torch already imported): (exit code, stderr lines that report an error)."""
    code = main(["-q", "--no-progress", *map(str, args)])
    return code, [line for line in capsys.readouterr().err.splitlines() if "error" in line]


def one_line_error(run, code, fragment):
    assert run.returncode == code, run.stdout + run.stderr
    lines = [line for line in run.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and fragment in lines[0], run.stderr
    assert "Traceback" not in run.stderr


def test_inmemory_training_end_to_end(dataset_1500, tmp_path, capsys):
    out, ckpt = tmp_path / "result.json", tmp_path / "ck.pt"
    run = trainer("--mode", "inmemory", "--dataset", dataset_1500, "--epochs", 2, "--hidden", 16, "--batch-size", 300,
                  "--fanouts", "5,5", "--eval-batch-size", 1000, "--json-out", out, "--checkpoint", ckpt,
                  "--no-progress")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert [EPOCH_LINE.match(line) is not None for line in lines[:2]] == [True, True], lines
    assert re.fullmatch(r"best val \d\.\d{4} at epoch [12]: test \d\.\d{4}", lines[2]), lines
    assert len(lines) == 3 and "Traceback" not in run.stderr
    result = json.loads(out.read_text())
    assert [r["epoch"] for r in result["epochs"]] == [1, 2] and result["best_epoch"] in (1, 2)
    # the node task's default lr; link prediction has its own (tests/trainer/test_link_train.py)
    assert result["config"]["hidden"] == 16 and result["config"]["lr"] == 0.003 and result["device"] == "cpu"
    train_nodes = open_dataset(dataset_1500).manifest.splits.train
    assert [r["samples"] for r in result["epochs"]] == [train_nodes] * 2 and 0 <= result["test_acc_at_best"] <= 1
    # 4 classes: auto judges by accuracy, so the scores are the accuracies
    assert result["metric"] == "accuracy" and result["config"]["metric"] == "auto"
    assert "metric accuracy (auto: 4 classes, not a binary task)" in run.stderr
    assert [r["val_score"] for r in result["epochs"]] == [r["val_acc"] for r in result["epochs"]]
    assert (result["best_val_score"], result["test_score_at_best"]) == (result["best_val_acc"],
                                                                        result["test_acc_at_best"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt", "result.json"]

    # the same checkpoint with another width: one line, exit 1, before any training
    bad = trainer("--mode", "inmemory", "--dataset", dataset_1500, "--hidden", 32, "--checkpoint", ckpt, "--resume")
    one_line_error(bad, 1, "hidden 16 in the checkpoint, 32 now")
    code, err = in_process(capsys, "--mode", "inmemory", "--dataset", dataset_1500, "--hidden", 16, "--checkpoint",
                           ckpt, "--resume", "--metric", "roc_auc")
    assert code == 1 and err == [f"megabatch train: error: {ckpt}: the checkpointed run is judged by accuracy, not "
                                 "roc_auc (resume with --metric accuracy or auto, or start a new run)"], err
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    code, err = in_process(capsys, "--mode", "inmemory", "--dataset", dataset_1500, "--hidden", 16, "--checkpoint",
                           ckpt, "--resume")
    assert code == 1 and len(err) == 1 and "corrupt or unreadable checkpoint" in err[0], err


@pytest.mark.parametrize("args, code, fragment", [
    (["--epochs", "0", "--mode", "inmemory", "--dataset", "x"], 2, "--epochs: must be positive, got 0"),
    (["--mode", "inmemory"], 2, "--mode inmemory needs --dataset"),
    ([], 2, "give --socket PATH"),
    (["--socket", "s", "--mode", "inmemory", "--dataset", "x"], 2, "exclude each other"),
    (["--socket", "s", "--fanouts", "5,5"], 2, "inmemory-mode options"),
    (["--mode", "inmemory", "--dataset", "x", "--fanouts", "5,0"], 2, "each fanout must be positive or -1"),
    (["--mode", "inmemory", "--dataset", "x", "--resume"], 2, "--resume needs --checkpoint"),
    (["--mode", "inmemory", "--dataset", "no-such-dir"], 1, "no-such-dir: not a directory"),
    (["--mode", "inmemory", "--config", "missing.toml"], 1, "missing.toml: config file not found"),
    (["--mode", "inmemory", "--dataset", "x", "--feature-cache", "1M"], 2, "--feature-cache: daemon mode only"),
    (["--socket", "s", "--feature-cache", "lots"], 2, "cannot parse 'lots' as a size"),
    (["--socket", "s", "--metric", "f1"], 2, "--metric: invalid choice: 'f1'"),
    (["--socket", "s", "--nproc-per-node", "2", "--feature-cache", "1M"], 2, "--feature-cache: not with several"),
    (["--mode", "inmemory", "--dataset", "x", "--dist-timeout", "0"], 2, "--dist-timeout: must be a positive"),
])
def test_bad_arguments_are_one_line_without_traceback(tmp_path, args, code, fragment):
    one_line_error(trainer(*args, cwd=tmp_path), code, fragment)


def test_feature_cache_flag_takes_a_size_or_zero():
    parser = build_parser()
    assert parser.parse_args(["--socket", "s", "--feature-cache", "256M"]).feature_cache == 256 << 20
    assert parser.parse_args(["--socket", "s", "--feature-cache", "0"]).feature_cache == 0
    assert parser.parse_args(["--socket", "s"]).feature_cache == 0


@pytest.mark.parametrize("flag, text, reason", [
    ("--metrics-port", "65536", "must be a port from 0 to 65535, got 65536"),
    ("--connect-timeout", "-1", "must be a non-negative number of seconds, got -1"),
    ("--dist-timeout", "inf", "must be a positive number of seconds, got inf"),
    ("--sampler-seed", "-2", "must not be negative, got -2"),
])
def test_ports_seconds_and_seeds_are_checked_when_parsed(capsys, flag, text, reason):
    parser = build_parser()
    args = parser.parse_args(["--socket", "s", "--metrics-port", "9450", "--connect-timeout", "2.5"])
    assert (args.metrics_port, args.connect_timeout) == (9450, 2.5)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--socket", "s", flag, text])
    assert exit_info.value.code == 2
    assert f"argument {flag}: {reason}" in capsys.readouterr().err


def test_bad_values_for_the_dataset_are_one_line(dataset_1500, capsys):
    code, err = in_process(capsys, "--mode", "inmemory", "--dataset", dataset_1500, "--model", "gat", "--hidden", 30)
    assert code == 1 and err == ["megabatch train: error: hidden (30) must be a multiple of heads (4) for gat"]
    code, err = in_process(capsys, "--mode", "inmemory", "--dataset", dataset_1500, "--fanouts", "5,5",
                           "--eval-fanouts", "5")
    assert code == 1 and len(err) == 1 and "eval_fanouts [5] needs one entry per hop" in err[0], err


def test_sampler_settings_come_from_flags_then_config_then_defaults(tmp_path):
    config = tmp_path / "loader.toml"
    config.write_text('[dataset]\npath = "ds"\n\n[sampler]\nbatch_size = 512\nfanouts = [15, 10]\n'
                      'eval_fanouts = [-1, -1]\nseed = 9\n')
    parser = build_parser()
    settings, dataset = resolve_sampler(parser.parse_args(["--config", str(config)]))
    assert (settings.batch_size, settings.fanouts, settings.eval_fanouts, settings.seed) == (512, (15, 10),
                                                                                              (-1, -1), 9)
    assert dataset == tmp_path.resolve() / "ds" and settings.eval_batch_size == 1024  # the loader's default
    settings, dataset = resolve_sampler(parser.parse_args(["--config", str(config), "--batch-size", "64",
                                                           "--dataset", "other", "--fanouts", "3"]))
    assert (settings.batch_size, settings.fanouts, settings.eval_fanouts, settings.seed) == (64, (3,), None, 9)
    assert str(dataset) == "other"
    settings, dataset = resolve_sampler(parser.parse_args([]))
    assert (settings.batch_size, settings.fanouts, settings.eval_fanouts, settings.eval_batch_size,
            settings.seed, dataset) == (1024, (10, 5), None, 1024, 0, None)


# A run stands in for the trainer (nothing to train: the test is about the signals around it), and an exit
# handler signals the process while it ends, where the interpreter's teardown after torch used to take seconds
ENDING = """
import atexit, os, signal, sys
from trainer import cli

def run(args, argv, ranks, stop):
    if "term-during-run" in sys.argv:
        os.kill(os.getpid(), signal.SIGTERM)  # handled before kill returns: a stop request, as systemd sends it
    print("run over", flush=True)
    return 0

cli._run = run
atexit.register(os.kill, os.getpid(), signal.SIGINT if "int-while-ending" in sys.argv else signal.SIGTERM)
cli.exit_program(cli.main(["--mode", "inmemory", "--dataset", "unused"]))
"""


@pytest.mark.parametrize("case, code", [
    ("term-during-run", 130),  # the second SIGTERM: 130 as documented (it was 143, the default action)
    ("term-while-ending", 0),  # the first, after the run: the run's own status
    ("int-while-ending", 130),
])
def test_a_signal_while_the_process_ends_exits_as_documented(case, code):
    run = subprocess.run([sys.executable, "-c", ENDING, case], capture_output=True, text=True, timeout=300)
    assert run.returncode == code, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "run over" and "Traceback" not in run.stderr, run.stdout + run.stderr
