"""The operator's CLI: ``--version``, ``serve --check`` (what serve would refuse, without starting anything), and
the stamped log lines outside journald."""

import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from loader import __version__
from loader.cli import EX_CONFIG, main
from loader.daemon.check import format_config
from loader.daemon.config import config_from_mapping, load_config
from loader.format.dataset import FORMAT_VERSION
from proto.messages import PROTOCOL_VERSION
from tests.paths import REPO_ROOT

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"


def test_version_prints_the_program_format_and_protocol_versions(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"megabatch {__version__} (dataset format {FORMAT_VERSION}, wire protocol {PROTOCOL_VERSION})"


def test_version_from_the_command_line():
    run = subprocess.run([sys.executable, "-m", "loader.cli", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"megabatch \S+ \(dataset format \d+\.\d+, wire protocol \d+\)\n", run.stdout), run.stdout


def demo_config(tmp_path: Path, dataset: Path) -> Path:
    """deploy/config/demo.toml where `make demo` puts it, beside a demo-data/dataset that is ``dataset``."""
    config = tmp_path / "deploy" / "config" / "demo.toml"
    config.parent.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "deploy" / "config" / "demo.toml", config)
    (tmp_path / "demo-data").mkdir()
    (tmp_path / "demo-data" / "dataset").symlink_to(dataset)
    return config


def check(config: Path, capsys, *flags: str) -> tuple[int, list[str], list[str]]:
    code = main(["--no-progress", *flags, "serve", "--check", "--config", str(config)])
    captured = capsys.readouterr()
    return code, captured.out.strip().splitlines(), captured.err.strip().splitlines()


def test_check_passes_the_demo_config_and_starts_nothing(tmp_path, capsys, dataset_3k):
    config = demo_config(tmp_path, dataset_3k)
    with socket.socket() as taken:  # the configured metrics port is in use: a check does not bind it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config.write_text(config.read_text().replace("port = 0", f"port = {port}"))
        code, out, err = check(config, capsys, "-q")
    assert code == 0, err
    assert err == []
    assert out[-1].startswith(f"# ok: {config} is valid") and "nothing was started" in out[-1], out
    plan = [line for line in out if line.startswith("# memory plan")]
    assert len(plan) == 1 and "budget 512 MiB" in plan[0] and "slots (" in plan[0], out
    assert any(line.startswith("# clients and slots: ") for line in out), out
    assert not (tmp_path / "demo-data" / "loader.sock").exists()
    # the report is TOML: the resolved config, which reads back as the same config, and comments
    text = "\n".join(out)
    assert f'path = "{tmp_path / "demo-data" / "dataset"}"' in text
    assert config_from_mapping(tomllib.loads(text)) == load_config(config)


@pytest.mark.parametrize("mode", ["exact", "staged", "inmemory"])
def test_check_plans_every_mode_without_opening_it(tmp_path, capsys, dataset_3k, mode):
    config = demo_config(tmp_path, dataset_3k)
    config.write_text(config.read_text() + f'\n[loader]\nmode = "{mode}"\n')
    code, out, err = check(config, capsys, "-q")
    assert code == 0, err
    assert any(line.startswith(f"# memory plan ({mode})") for line in out), out


def test_the_config_reads_back_with_every_auto_and_default():
    config = config_from_mapping({"dataset": {"path": "/data/ds"}, "fullgraph": {"neighbor_cache": 0},
                                  "server": {"socket_mode": "0600", "allow_uids": [1000, 7]}})
    text = format_config(config)
    assert 'max_clients = "auto"' in text and 'socket_mode = "0600"' in text and "allow_uids = [7, 1000]" in text
    assert config_from_mapping(tomllib.loads(text)) == config


def _unknown_key(config: Path, dataset: Path) -> None:
    config.write_text(config.read_text().replace("[sampler]\n", "[sampler]\nfanout = [3]\n"))


def _bad_value(config: Path, dataset: Path) -> None:
    config.write_text(config.read_text().replace("batch_size = 1024", "batch_size = 0"))


def _missing_dataset(config: Path, dataset: Path) -> None:
    config.write_text(config.read_text().replace("../../demo-data/dataset", "../../demo-data/none"))


def _corrupt_manifest(config: Path, dataset: Path) -> None:
    copy = config.parent / "copy"
    shutil.copytree(dataset, copy)
    (copy / "manifest.json").write_text('{"format": "megabatch-dataset", "version": ')
    config.write_text(config.read_text().replace("../../demo-data/dataset", "copy"))


def _small_budget(config: Path, dataset: Path) -> None:
    config.write_text(config.read_text().replace('budget = "512M"', 'budget = "6M"'))


@pytest.mark.parametrize("damage, fragment", [
    (_unknown_key, "[sampler] fanout: unknown option"),
    (_bad_value, "[sampler] batch_size: must be >= 1, got 0"),
    (_missing_dataset, "demo-data/none: not a directory"),
    (_corrupt_manifest, "manifest.json: corrupt JSON"),
    (_small_budget, "memory budget 6 MiB is too small for mode hierarchical"),
], ids=["unknown-key", "bad-value", "missing-dataset", "corrupt-manifest", "budget-too-small"])
def test_check_refuses_what_serve_refuses_in_one_line_with_ex_config(tmp_path, capsys, dataset_3k, damage, fragment):
    config = demo_config(tmp_path, dataset_3k)
    damage(config, dataset_3k)
    code, out, err = check(config, capsys)  # not -q: nothing but the reason may reach stderr
    assert code == EX_CONFIG == 78
    assert out == []
    assert len(err) == 1 and err[0].startswith("megabatch: error:") and fragment in err[0], err
    assert err[0].endswith(f"(configuration error: not retried, exit {EX_CONFIG})")
    assert not (tmp_path / "demo-data" / "loader.sock").exists()


# --- log lines --------------------------------------------------------------------------------------

def test_loader_log_lines_are_stamped_outside_journald(tmp_path, capsys, dataset_3k):
    code, _, err = check(demo_config(tmp_path, dataset_3k), capsys)
    assert code == 0, err
    assert err, "the hierarchical plan logs its mega-batch size at info"
    for line in err:
        assert re.fullmatch(rf"{STAMP} (INFO|WARNING) megabatch: .+", line), line


def test_loader_log_lines_keep_the_journald_priority_under_journald(tmp_path, dataset_3k):
    config = demo_config(tmp_path, dataset_3k)
    with open(tmp_path / "stderr", "w+") as stderr:
        st = os.fstat(stderr.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        run = subprocess.run([sys.executable, "-m", "loader.cli", "serve", "--check", "--config", str(config)],
                             stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=300, env=env)
        stderr.seek(0)
        lines = stderr.read().splitlines()
    assert run.returncode == 0, lines
    assert lines and all(re.fullmatch(r"<[4-7]>megabatch: .+", line) for line in lines), lines
