"""bench/link_throughput.py: its daemons' configs, MariusGNN's I/O model and the report."""

import tomllib
from pathlib import Path

import pytest

from bench.link_throughput import ModeResult, model_partitions, parse_args, report, serve_config
from loader.daemon.config import config_from_mapping
from loader.sampling.comet import comet_plan


def test_every_mode_gets_a_config_the_daemon_accepts():
    args = parse_args([])
    for mode in ("exact", "comet", "beta", "mmap", "inmemory"):
        config = config_from_mapping(tomllib.loads(serve_config(mode, Path("/ds"), Path("/s.sock"), 9999, args)))
        assert config.memory.budget == (16 << 30 if mode == "inmemory" else 384 << 20)
        assert config.sampler.batch_size == 256
        assert (config.server.max_clients, config.publisher.slots, config.metrics.port) == (1, 2, 9999)
        if mode in ("comet", "beta"):
            assert config.loader.mode == "hierarchical" and config.link.order == mode
            assert config.hierarchy.megabatch_fraction == 0.0625
        else:
            assert config.loader.mode == mode and config.fullgraph.superbatch == 8
        assert config.io.check_reads == (mode != "mmap")


def test_the_model_is_the_plans_reads():
    assert model_partitions("comet", 64, 4, 0, 1) == comet_plan(64, 4, None, seed=0, epoch=1).io_partitions
    assert model_partitions("beta", 16, 4, 0, 1) > 0


def test_report_rows():
    args = parse_args(["--modes", "comet,mmap"])
    results = [ModeResult("comet", 10, 2560, 2.0, 4 << 20, True, 30, 12, 28),
               ModeResult("mmap", 10, 2560, 4.0, 8 << 20, False),
               ModeResult("exact", error="the daemon exited with 78")]
    text = report(results, args, 64 << 20, 64)
    assert "| comet | 1,280 | 2.00x | 5.0 | 1.64 | yes | 30 (12) | 28 (28 MiB) |  |" in text
    assert "| mmap | 640 | 1.00x | 2.5 | 3.28 | no | - | - |  |" in text
    assert "| exact | 0 | 0.00x | 0.0 | - | no | - | - | the daemon exited with 78 |" in text


@pytest.mark.parametrize("argv, message", [(["--modes", "comet,marius"], "unknown marius"),
                                           (["--fraction", "1"], "expected a share in")])
def test_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err
