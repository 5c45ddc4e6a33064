"""The command line: one-line errors, non-zero exits, and nothing half-written on any failure."""

import errno
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import loader.format.fileio
import loader.offline.layout
from loader.cli import main
from tests.graphs import random_graph, write_raw


def make_raw(tmp_path, n=300, e=2000, d=4):
    ids = np.arange(n)
    return write_raw(tmp_path / "raw", *random_graph(np.random.default_rng(0), n, e, d), 3,
                     (ids[: n // 2], ids[n // 2: 3 * n // 4], ids[3 * n // 4:]))


def leftovers(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in ("raw",))


def run_cli(args, capsys):
    code = main(["--no-progress", "-q", *args])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def test_prepare_verify_inspect_end_to_end(tmp_path):
    make_raw(tmp_path)
    exe = [sys.executable, "-m", "loader.cli"]
    prep = subprocess.run([*exe, "--no-progress", "prepare", str(tmp_path / "raw"), str(tmp_path / "ds"),
                           "--partitions", "4", "--memory-budget", "256M"], capture_output=True, text=True)
    assert prep.returncode == 0, prep.stderr
    assert "edge-cut" in prep.stdout
    ver = subprocess.run([*exe, "verify", str(tmp_path / "ds")], capture_output=True, text=True)
    assert ver.returncode == 0 and ver.stdout.startswith("ok:"), ver.stdout + ver.stderr
    ins = subprocess.run([*exe, "inspect", "--json", str(tmp_path / "ds")], capture_output=True, text=True)
    summary = json.loads(ins.stdout)
    assert summary["num_nodes"] == 300 and summary["partitions"]["count"] == 4


def test_bad_input_is_one_line_without_traceback(tmp_path):
    make_raw(tmp_path)
    np.save(tmp_path / "raw" / "edge_src.npy", np.full(2000, 10**6, dtype=np.int64))
    run = subprocess.run([sys.executable, "-m", "loader.cli", "prepare", str(tmp_path / "raw"), str(tmp_path / "ds"),
                          "--partitions", "2"], capture_output=True, text=True)
    assert run.returncode == 1
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert errors == [errors[0]] and "outside [0, 300)" in errors[0]
    assert "Traceback" not in run.stderr
    assert leftovers(tmp_path) == []


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-13])


def _garbage(path):
    path.write_bytes(os.urandom(500))


@pytest.mark.parametrize("damage, message", [
    (lambda raw: _truncate(raw / "edge_dst.npy"), "truncated"),
    (lambda raw: _garbage(raw / "features.npy"), "not a .npy file"),
    (lambda raw: (raw / "raw.json").write_text("{"), "corrupt JSON"),
    (lambda raw: np.save(raw / "features.npy", np.zeros((299, 4), np.float32)), "shape (299, 4)"),
    (lambda raw: np.save(raw / "edge_dst.npy", np.full(2000, -1, np.int64)), "outside [0, 300)"),
    (lambda raw: np.save(raw / "labels.npy", np.full(300, 7, np.int64)), "outside [-1, 3)"),
    (lambda raw: np.save(raw / "features.npy", np.where(np.arange(1200).reshape(300, 4) == 777, np.nan, 1.0)
                         .astype(np.float32)), "row 194 has NaN"),
    (lambda raw: np.save(raw / "edge_src.npy", np.zeros(1999, np.int64)), "1999 edges"),
    (lambda raw: (raw / "labels.npy").unlink(), "file not found"),
])
def test_bad_raw_input(tmp_path, capsys, damage, message):
    make_raw(tmp_path)
    damage(tmp_path / "raw")
    code, err = run_cli(["prepare", str(tmp_path / "raw"), str(tmp_path / "ds"), "--partitions", "2"], capsys)
    assert code == 1
    assert len(err) == 1 and err[0].startswith("megabatch: error:") and message in err[0], err
    assert leftovers(tmp_path) == []


def test_existing_output_is_refused_and_untouched(tmp_path, capsys):
    make_raw(tmp_path)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "keep").write_text("mine")
    code, err = run_cli(["prepare", str(tmp_path / "raw"), str(tmp_path / "ds"), "--partitions", "2"], capsys)
    assert code == 1 and "already exists" in err[0]
    assert (tmp_path / "ds" / "keep").read_text() == "mine"


class _FullDisk:
    """Stand-in for the ``os`` module inside loader.format.fileio whose writes fail after a byte quota."""

    def __init__(self, quota):
        self.quota = quota

    def __getattr__(self, name):
        return getattr(os, name)

    def _spend(self, data):
        self.quota -= len(data)
        if self.quota < 0:
            raise OSError(errno.ENOSPC, "No space left on device")

    def write(self, fd, data):
        self._spend(data)
        return os.write(fd, data)

    def pwrite(self, fd, data, offset):
        self._spend(data)
        return os.pwrite(fd, data, offset)


@pytest.mark.parametrize("quota", [1000, 40_000, 80_000, 115_000])  # ~118 kB written in all
def test_full_disk_mid_prepare(tmp_path, capsys, monkeypatch, quota):
    make_raw(tmp_path)
    monkeypatch.setattr(loader.format.fileio, "os", _FullDisk(quota))
    code, err = run_cli(["prepare", str(tmp_path / "raw"), str(tmp_path / "ds"), "--partitions", "2"], capsys)
    assert code == 1
    assert len(err) == 1 and "no space left on device" in err[0], err
    assert leftovers(tmp_path) == []


def test_full_disk_mid_generate_leaves_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loader.format.fileio, "os", _FullDisk(50_000))
    code, err = run_cli(["generate", str(tmp_path / "g"), "--nodes", "2000", "--avg-degree", "5",
                         "--feat-dim", "8", "--classes", "3"], capsys)
    assert code == 1 and "no space left on device" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_mid_prepare_removes_the_temporary_dataset(tmp_path, capsys, monkeypatch):
    make_raw(tmp_path)
    seen = {}

    def interrupted(*args, **kwargs):
        seen["tmp"] = [p.name for p in tmp_path.iterdir()]
        raise KeyboardInterrupt

    monkeypatch.setattr("loader.offline.prepare.write_features", interrupted)
    code, err = run_cli(["prepare", str(tmp_path / "raw"), str(tmp_path / "ds"), "--partitions", "2"], capsys)
    assert code == 130 and "interrupted" in err[0]
    assert any(name.startswith(".ds.tmp-") for name in seen["tmp"])  # work was under way
    assert leftovers(tmp_path) == []


def test_verify_cli_exit_codes(tmp_path, capsys):
    make_raw(tmp_path)
    assert main(["--no-progress", "-q", "prepare", str(tmp_path / "raw"), str(tmp_path / "ds"),
                 "--partitions", "3"]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "ds")]) == 0
    path = tmp_path / "ds" / "indices.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x10
    path.write_bytes(bytes(data))
    assert main(["verify", str(tmp_path / "ds")]) == 1
    assert "FAIL checksums: indices.npy" in capsys.readouterr().out


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["prepare", "a", "b", "--partitions", "0"])
    assert exc.value.code == 2
    assert "must be positive" in capsys.readouterr().err
    code, err = run_cli(["prepare", "x", "y", "--partitions", "2", "--memory-budget", "lots"], capsys)
    assert code == 1 and "cannot parse 'lots'" in err[0]


def test_train_help_is_the_trainers_usage():
    # 'megabatch train' hands its arguments to 'python -m trainer' in a fresh interpreter
    run = subprocess.run([sys.executable, "-m", "loader.cli", "train", "--help"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: megabatch train")
    assert "--socket" in run.stdout


def test_serve_on_a_missing_dataset_says_only_why_it_did_not_start(tmp_path, capsys):
    """The shutdown after a failed start-up used to log "stopped" before the error: the reader saw a daemon
    that seemed to have run, and the reason came last."""
    config = tmp_path / "serve.toml"
    config.write_text(f'[dataset]\npath = "{tmp_path}/none"\n[server]\nsocket = "{tmp_path}/s.sock"\n'
                      "[metrics]\nport = 0\n")
    code = main(["--no-progress", "serve", "--config", str(config)])  # not -q: "stopped" is logged at info
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 78
    assert len(err) == 1 and err[0].startswith("megabatch: error:") and "none" in err[0], err


def test_serve_on_a_metrics_port_in_use_is_a_configuration_error(tmp_path, capsys):
    """Two daemons on one metrics port: one line naming the port and the key, and exit 78, so systemd does not
    restart into the same port (it was "I/O error while serve: Address already in use", exit 1)."""
    make_raw(tmp_path)
    dataset = tmp_path / "ds"
    assert main(["--no-progress", "-q", "prepare", str(tmp_path / "raw"), str(dataset), "--partitions", "3"]) == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "serve.toml"
        config.write_text(f'[dataset]\npath = "{dataset}"\n[server]\nsocket = "{tmp_path}/s.sock"\n'
                          f'[metrics]\naddress = "127.0.0.1"\nport = {port}\n')
        code = main(["--no-progress", "-q", "serve", "--config", str(config)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 78
    assert len(err) == 1 and f"127.0.0.1:{port}" in err[0] and "[metrics] port" in err[0], err
    assert not (tmp_path / "s.sock").exists()


def test_prepare_builds_the_aggregation_cache_it_is_asked_for(tmp_path, capsys):
    from loader.cli import AGGREGATION_KINDS
    from loader.format.aggregates import dataset_cache
    from loader.format.dataset import open_dataset
    from loader.offline.aggregation import KINDS
    from loader.offline.verify import verify_dataset

    assert set(AGGREGATION_KINDS) == set(KINDS)
    make_raw(tmp_path)
    code, err = run_cli(["prepare", str(tmp_path / "raw"), str(tmp_path / "ds"), "--partitions", "4",
                         "--aggregation-cache", "gcn"], capsys)
    assert code == 0, err
    cache = dataset_cache(open_dataset(tmp_path / "ds"))
    assert cache is not None and cache.kind == "gcn" and verify_dataset(tmp_path / "ds").ok
    with pytest.raises(SystemExit):  # argparse: a kind nobody builds
        main(["prepare", str(tmp_path / "raw"), str(tmp_path / "ds2"), "--aggregation-cache", "max"])
