"""What Prometheus sees of a trainer (``trainer.scrape``): the last epoch stays scrapeable after training,
``process_*`` series, a file_sd target with the real port that goes away at exit, checked labels."""

import json
import math
import os
import queue
import re
import signal
import stat
import subprocess
import sys
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loader.format.dataset import open_dataset
from tests.graphs import generated_dataset
from trainer.cli import main
from trainer.metrics import TrainerMetrics
from trainer.scrape import MAX_LABELS, FileSdTarget, linger, target_host

STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                     r"megabatch: ")
PROGRESS = re.compile(r"megabatch: epoch (\d)/2: step (\d+)/(\d+) \((\d+)%\), [\d,]+ samples/s, data-wait \d+\.\d%, "
                      r"ETA \d+:\d\d$")
WAIT_S = 300
"""Longest wait for a line of the trainer: a bound that only a hung trainer reaches, not a timing."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return generated_dataset(tmp_path_factory.mktemp("scrape"), nodes=1500, feat_dim=16, classes=4)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(series name, sorted labels) -> value of a Prometheus text exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_last_epoch_stays_scrapeable_until_sigterm_and_the_target_file_goes(dataset, tmp_path):
    sd, out = tmp_path / "trainer.json", tmp_path / "result.json"
    env = {key: value for key, value in os.environ.items() if key != "JOURNAL_STREAM"}
    # stderr is a pipe, not a terminal: progress comes as log lines (--progress-interval 0: one per step)
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--mode", "inmemory", "--dataset", str(dataset),
                             "--epochs", "2", "--hidden", "16", "--batch-size", "300", "--fanouts", "5,5",
                             "--eval-batch-size", "1000", "--json-out", str(out), "--progress-interval", "0",
                             "--metrics-port", "0", "--metrics-file-sd", str(sd), "--metrics-label", "team=gnn",
                             "--metrics-label", "run=r1", "--metrics-linger", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        # the linger line is logged once the wait's signal handlers are in place
        while not seen or "metrics: serving the final values" not in seen[-1]:
            line = lines.get(timeout=WAIT_S)
            assert line is not None, f"the trainer exited early ({proc.wait()}): " + "\n".join(seen)
            seen.append(line)
        target = json.loads(sd.read_text())
        assert stat.S_IMODE(sd.stat().st_mode) == 0o644  # Prometheus runs as another user
        assert len(target) == 1 and target[0]["labels"] == {"team": "gnn", "run": "r1"}
        host, port = target[0]["targets"][0].rsplit(":", 1)
        assert host == "127.0.0.1" and f"port {port} for 600 s more" in seen[-1]
        # training is over (the result is written): what a scrape now finds is the final epoch
        result = json.loads(out.read_text())
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30) as response:
            scraped = samples(response.read().decode())
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=WAIT_S)
        reader.join(timeout=WAIT_S)
    while (line := lines.get_nowait()) is not None:
        seen.append(line)
    assert code == 0, "\n".join(seen)
    assert not sd.exists()  # removed at exit: Prometheus drops the target

    last = result["epochs"][-1]
    assert scraped[("megabatch_trainer_epoch", ())] == 2
    assert math.isclose(scraped[("megabatch_trainer_loss", ())], last["loss"], rel_tol=1e-9)
    assert math.isclose(scraped[("megabatch_trainer_data_wait_ratio", ())], last["data_wait"], rel_tol=1e-9)
    assert scraped[("megabatch_trainer_accuracy", (("split", "val"),))] == last["val_acc"]
    train_nodes = open_dataset(dataset).manifest.splits.train
    assert scraped[("megabatch_trainer_samples_total", ())] == 2 * train_nodes
    wait_total = scraped[("megabatch_trainer_data_wait_seconds_total", ())]
    assert math.isclose(wait_total, sum(r["wait_s"] for r in result["epochs"]), rel_tol=1e-6)
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_start_time_seconds"):
        assert scraped[(name, ())] > 0, name

    # every log line carries time and level (no journald here); progress lines per step, at most 100%
    assert seen and all(STAMPED.match(line) for line in seen), [line for line in seen if not STAMPED.match(line)]
    assert any("training finished: 2 epochs (last epoch 2)" in line for line in seen)
    assert "megabatch: metrics: SIGTERM ended the wait" in seen[-1]
    steps = [m for m in map(PROGRESS.search, seen) if m]
    batches = result["epochs"][0]["batches"]
    assert [(int(m[1]), int(m[2]), int(m[3])) for m in steps] == [(e, s, batches) for e in (1, 2)
                                                                  for s in range(1, batches + 1)]
    assert max(int(m[4]) for m in steps) == 100


@pytest.mark.parametrize("args, fragment", [
    (["--metrics-label", "team"], "--metrics-label: expected KEY=VALUE, got 'team'"),
    (["--metrics-label", "1team=x"], "'1team' is not a Prometheus label name"),
    (["--metrics-label", "te-am=x"], "'te-am' is not a Prometheus label name"),
    (["--metrics-label", "__name__=x"], "names starting with __ are reserved"),
    (["--metrics-label", "job=x"], "'job': the scrape config names the job"),
    (["--metrics-label", "team="], "the value of 'team' must be 1 to 256 printable characters"),
    (["--metrics-label", "team=a\nb"], "the value of 'team' must be 1 to 256 printable characters"),
    ([arg for i in range(MAX_LABELS + 1) for arg in ("--metrics-label", f"k{i}=v")],
     f"--metrics-label: at most {MAX_LABELS} labels, got {MAX_LABELS + 1}"),
    (["--metrics-label", "a=1", "--metrics-label", "a=2"], "--metrics-label: a given more than once"),
])
def test_label_errors_are_one_line(capsys, args, fragment):
    with pytest.raises(SystemExit) as exit_:
        main(["--mode", "inmemory", "--dataset", "x", "--metrics-port", "0", "--metrics-file-sd", "sd.json", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and fragment in err, err


@pytest.mark.parametrize("args, fragment", [
    (["--metrics-file-sd", "sd.json"], "--metrics-file-sd needs --metrics-port (0: a free port)"),
    (["--metrics-port", "0", "--metrics-label", "a=b"], "give --metrics-file-sd PATH"),
    (["--metrics-port", "65536"], "--metrics-port: must be a port from 0 to 65535, got 65536"),
    (["--metrics-linger", "-1"], "--metrics-linger: must be a non-negative number of seconds, got -1"),
    (["--progress-interval", "x"], "--progress-interval: expected a number, got 'x'"),
])
def test_metrics_option_errors_are_one_line(capsys, args, fragment):
    with pytest.raises(SystemExit) as exit_:
        main(["--mode", "inmemory", "--dataset", "x", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and fragment in err, err


def test_a_target_file_in_a_missing_directory_is_one_line_before_training(dataset, tmp_path, capsys):
    code = main(["--mode", "inmemory", "--dataset", str(dataset), "--metrics-port", "0", "--metrics-file-sd",
                 str(tmp_path / "no-such-dir" / "sd.json"), "--no-progress"])
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 1 and err == [f"megabatch train: error: --metrics-file-sd: directory {tmp_path / 'no-such-dir'} "
                                 "does not exist"], err


def test_target_file_is_replaced_whole_and_removed_only_while_it_is_ours(tmp_path):
    path = tmp_path / "sd.json"
    path.write_text("[]\n")  # a previous run's file: replaced, not appended to
    ours = FileSdTarget(path, "127.0.0.1", 9451, {"team": "gnn"})
    assert json.loads(path.read_text()) == [{"targets": ["127.0.0.1:9451"], "labels": {"team": "gnn"}}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sd.json"]  # no temporary file left behind
    ours.remove()
    assert not path.exists()
    ours.remove()  # gone already: nothing to do, nothing raised
    ours = FileSdTarget(path, "127.0.0.1", 9451, {})
    FileSdTarget(path, "127.0.0.1", 9452, {})  # another job given the same path took it over
    ours.remove()
    assert json.loads(path.read_text())[0]["targets"] == ["127.0.0.1:9452"]


def test_target_host_names_a_connectable_host():
    assert target_host("127.0.0.1") == "127.0.0.1"
    assert target_host("::1") == "[::1]"
    assert target_host("0.0.0.0") == target_host("::") == target_host("") != "0.0.0.0"


def test_process_series_are_on_the_trainers_own_registry():
    families = {family.name for family in TrainerMetrics().registry.collect()}
    assert {"process_resident_memory_bytes", "process_cpu_seconds", "process_start_time_seconds",
            "python_info", "megabatch_trainer_data_wait_seconds", "megabatch_trainer_samples"} <= families


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_linger_and_the_previous_handlers_come_back(signum):
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    senders: list[threading.Thread] = []

    def send() -> bool:
        # called once linger's handlers are in place; from another thread, as a signal may arrive on any
        senders.append(threading.Thread(target=os.kill, args=(os.getpid(), signum)))
        senders[-1].start()
        return False

    assert linger(600, send) == signal.Signals(signum).name
    senders[0].join()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert linger(0) is None
    assert linger(600, lambda: True) is None  # skip: a stop already asked for means no wait
