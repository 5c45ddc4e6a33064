"""The daemon reports neighbour coverage and label skew per epoch (log, metrics, `megabatch status`) and warns
where they are bad."""

import asyncio
import logging
import re
import socket
import threading
import tomllib

import pytest

from loader.cli import main
from loader.daemon.config import config_from_mapping
from loader.daemon.hierarchical import pipeline
from loader.daemon.stages import SampledWork
from loader.daemon.status import format_status, scrape
from loader.offline.generate import generate_graph
from loader.offline.prepare import PrepareOptions, prepare_dataset
from proto.messages import EpochEnd, StartEpoch
from tests.daemon_harness import connect, consume, daemon_config, running_daemon, small_dataset
from tests.paths import REPO_ROOT


def epoch_log(config, caplog):
    """Run one training epoch through the daemon; (the epoch's report line, its warnings, the metrics)."""
    caplog.set_level(logging.INFO, logger="megabatch.pipeline")
    with running_daemon(config) as daemon, connect(config) as client:
        consume(client, StartEpoch(epoch=0), EpochEnd)
        metrics = daemon.metrics
    pipeline = [r for r in caplog.records if r.name == "megabatch.pipeline"]
    report = [r.getMessage() for r in pipeline if "neighbour coverage" in r.getMessage() and r.levelno == logging.INFO]
    warnings = [r.getMessage() for r in pipeline if r.levelno == logging.WARNING]
    return report, warnings, metrics


def sample_value(metrics, name, labels=None):
    return metrics.registry.get_sample_value(name, labels or {})


def test_badly_cut_graph_warns_and_names_the_knobs(tmp_path, caplog):
    # random partitions cut ~95% of edges: a quarter of them keeps a quarter of each node's neighbours, and
    # fanouts above the mean degree lose that share of the slots too
    dataset = small_dataset(tmp_path, nodes=3000, partitions=16, partitioner="random", avg_degree=6)
    config = daemon_config(dataset, tmp_path / "s.sock", hierarchy={"static_cache": False},
                           sampler={"fanouts": [15, 10], "eval_fanouts": [15, 10]})
    report, warnings, metrics = epoch_log(config, caplog)
    assert len(report) == 1 and "epoch 0" in report[0]
    coverage = sample_value(metrics, "megabatch_epoch_neighbour_coverage_ratio")
    assert coverage < 0.5
    assert any("neighbour coverage" in w and "megabatch_fraction" in w for w in warnings), warnings
    assert sample_value(metrics, "megabatch_quality_warnings_total", {"kind": "coverage"}) == 1
    # the counters run on with the next epoch's mega-batches, sampled ahead: only their sign is the epoch's
    assert sample_value(metrics, "megabatch_neighbour_slots_total", {"result": "lost"}) > 0


def test_whole_graph_mega_batch_loses_nothing(tmp_path, caplog):
    dataset = small_dataset(tmp_path, nodes=2000, partitions=8)
    config = daemon_config(dataset, tmp_path / "s.sock", hierarchy={"megabatch_fraction": 1.0})
    report, warnings, metrics = epoch_log(config, caplog)
    assert warnings == [] and "neighbour coverage 1.000, label skew 0.000 (0.000 by chance)" in report[0]
    assert sample_value(metrics, "megabatch_epoch_label_skew_excess") == 0
    assert sample_value(metrics, "megabatch_neighbour_slots_total", {"result": "lost"}) == 0



def test_an_epoch_sampled_ahead_but_never_trained_is_not_reported(tmp_path, caplog, monkeypatch):
    """The sampler runs up to an epoch ahead of the trainer: a 10-epoch run logged coverage for "epoch 11". One
    mega-batch per epoch and one pass: epoch 1's single pass is sampled and queued right after epoch 0 ends."""
    made: list[SampledWork] = []
    epoch_1_queued = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    def sampled_work(**fields):
        made.append(SampledWork(**fields))
        if len(made) == 2:  # epoch 1's pass: the sampler queues it at once (the queue is empty) and goes on
            loops.append(asyncio.get_running_loop())
            epoch_1_queued.set()
        return made[-1]

    monkeypatch.setattr(pipeline, "SampledWork", sampled_work)
    dataset = small_dataset(tmp_path, nodes=2000, partitions=8)
    config = daemon_config(dataset, tmp_path / "s.sock", hierarchy={"megabatch_fraction": 1.0, "passes": 1})
    caplog.set_level(logging.INFO, logger="megabatch.pipeline")
    with running_daemon(config), connect(config) as client:
        consume(client, StartEpoch(epoch=0), EpochEnd)
        assert epoch_1_queued.wait(60)
        # the loop ends the sampler's step (where the report was logged) before it runs this
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loops[0]).result(60)
        report = [r.getMessage() for r in caplog.records if "neighbour coverage" in r.getMessage()]
    assert report == ["epoch 0: neighbour coverage 1.000, label skew 0.000 (0.000 by chance) over 1 mega-batch of "
                      "8 partitions"], \
        report

@pytest.fixture(scope="module")
def demo_dataset(tmp_path_factory):
    """The graph `make demo` trains on (Makefile DEMO_ARGS, 64 METIS partitions)."""
    root = tmp_path_factory.mktemp("demo")
    generate_graph(root / "raw", num_nodes=200_000, avg_degree=20, feat_dim=64, num_classes=8, seed=0, progress=False)
    prepare_dataset(root / "raw", root / "dataset", PrepareOptions(num_partitions=64, memory_budget=512 << 20,
                                                                   progress=False))
    return root / "dataset"


def test_demo_graph_does_not_warn(demo_dataset, tmp_path, caplog):
    demo = tomllib.loads((REPO_ROOT / "deploy" / "config" / "demo.toml").read_text())
    demo["dataset"]["path"] = str(demo_dataset)
    demo["server"]["socket"] = str(tmp_path / "s.sock")
    report, warnings, metrics = epoch_log(config_from_mapping(demo), caplog)
    assert len(report) == 1 and warnings == [], (report, warnings)
    assert sample_value(metrics, "megabatch_epoch_neighbour_coverage_ratio") > 0.7


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_status_reports_coverage_from_the_metrics(tmp_path, caplog):
    dataset = small_dataset(tmp_path, nodes=2000, partitions=8)
    port = free_port()
    config = daemon_config(dataset, tmp_path / "s.sock", metrics={"port": port})
    with running_daemon(config), connect(config) as client:
        consume(client, StartEpoch(epoch=0), EpochEnd)
        text = format_status(scrape(f"http://127.0.0.1:{port}/metrics"))
    assert "mode hierarchical" in text
    assert re.search(r"last epoch: neighbour coverage \d\.\d{3}, label skew \d\.\d{3} \(\+\d\.\d{3} beyond chance\)",
                     text), text


def test_status_without_a_daemon_is_one_line_and_exit_1(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(f'[dataset]\npath = "{tmp_path}"\n[metrics]\nport = {free_port()}\n')
    assert main(["status", "--config", str(config)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read the daemon's metrics" in err[0]
    config.write_text(f'[dataset]\npath = "{tmp_path}"\n[metrics]\nport = 0\n')
    assert main(["status", "--config", str(config)]) == 1
    assert "serves no metrics" in capsys.readouterr().err
