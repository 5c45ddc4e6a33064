"""``megabatch train --task link --socket PATH``: a link predictor trained through the daemon is the one trained in
memory with the same settings (the daemon's batches are the reference's, and its evaluation batches embed the same
nodes and carry the same pairs); the flags the daemon's config owns are refused."""

import json

import pytest

from tests.daemon_harness import daemon_config, running_daemon
from tests.trainer.test_link_train import in_process, link_args, link_dataset, without_timings  # noqa: F401
from trainer.link.daemon_source import LinkDaemonSource
from trainer.link.options import DEFAULT_BUFFER_LR, DEFAULT_LINK_LR

DAEMON_SAMPLER = {"batch_size": 128, "fanouts": [5, 5], "eval_fanouts": [5, 5], "eval_batch_size": 1024}
"""``link_args``' sampler settings as a daemon config sets them."""


@pytest.mark.parametrize("mode", ["exact", "inmemory"])
def test_training_through_the_daemon_equals_training_in_memory(link_dataset, tmp_path, capsys, mode):  # noqa: F811
    local, remote = tmp_path / "local.json", tmp_path / "remote.json"
    options = ("--decoder", "mlp", "--epochs", 2)
    assert in_process(capsys, *link_args(link_dataset, *options, "--negatives", 2, "--disjoint",
                                         "--json-out", local))[0] == 0
    config = daemon_config(link_dataset, tmp_path / "s.sock", loader={"mode": mode}, sampler=DAEMON_SAMPLER,
                           memory={"budget": "256M"}, link={"negatives": 2, "disjoint": True})
    with running_daemon(config):
        code, lines, err = in_process(capsys, "--socket", config.server.socket, "--task", "link", "--hidden", 16,
                                      *options, "--json-out", remote)
    assert code == 0 and not err, err
    first, second = without_timings(json.loads(local.read_text())), without_timings(json.loads(remote.read_text()))
    assert second["source"].startswith(f"daemon {config.server.socket}") and second["source"].endswith(
        f"(link, mode {mode}, shuffled order)")
    assert second["config"]["negatives"] == 2 and second["config"]["disjoint"] is True
    assert second["config"]["lr"] == DEFAULT_LINK_LR
    for result in (first, second):
        result.pop("source")
    assert second == first


def test_the_hierarchical_mode_trains_as_the_in_memory_comet_emulation(link_dataset, tmp_path, capsys):  # noqa: F811
    local, remote = tmp_path / "local.json", tmp_path / "remote.json"
    assert in_process(capsys, *link_args(link_dataset, "--epochs", 2, "--link-order", "comet", "--buffer-partitions", 2,
                                         "--json-out", local))[0] == 0
    config = daemon_config(link_dataset, tmp_path / "s.sock", loader={"mode": "hierarchical"}, sampler=DAEMON_SAMPLER,
                           memory={"budget": "256M"}, hierarchy={"megabatch_fraction": 0.5})
    with running_daemon(config):
        code, _, err = in_process(capsys, "--socket", config.server.socket, "--task", "link", "--hidden", 16,
                                  "--epochs", 2, "--json-out", remote)
    assert code == 0 and not err, err
    first, second = json.loads(local.read_text()), json.loads(remote.read_text())
    assert first["buffer"]["order"] == "comet" and first["epochs"][0]["buffer_states"] > 1
    # the daemon says it serves COMET, so the trainer takes a buffer order's default lr, as --link-order comet does
    assert second["source"].endswith("(link, mode hierarchical, comet order)")
    assert first["config"]["lr"] == second["config"]["lr"] == DEFAULT_BUFFER_LR != DEFAULT_LINK_LR
    for a, b in zip(first["epochs"], second["epochs"], strict=True):
        assert (a["loss"], a["val"], a["test"], a["samples"]) == (b["loss"], b["val"], b["test"], b["samples"])
    assert first["test_at_best"] == second["test_at_best"]


def test_a_daemons_batches_say_the_epochs_batch_count(link_dataset, tmp_path):  # noqa: F811
    # a buffer order cuts each state's batches, so an epoch's count is not ceil(positives / batch): the progress
    # bar's total comes from the batches, as the daemon announced them
    config = daemon_config(link_dataset, tmp_path / "s.sock", loader={"mode": "hierarchical"}, sampler=DAEMON_SAMPLER,
                           memory={"budget": "256M"}, hierarchy={"megabatch_fraction": 0.5})
    with running_daemon(config):
        source = LinkDaemonSource(str(config.server.socket))
        try:
            batches = []
            for batch in source.train_batches(0):  # each batch views its slot until released
                batches.append(batch)
                batch.release()
                batch.release()  # idempotent
        finally:
            source.close()
    assert [b.stream_batches for b in batches] == [len(batches)] * len(batches)
    assert len(batches) != -(-source.train_positives // DAEMON_SAMPLER["batch_size"])


def test_the_daemons_settings_are_not_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        in_process(capsys, "--socket", "s", "--task", "link", "--negatives", 2, "--link-order", "comet")
    assert exit_.value.code == 2
    assert "--negatives, --link-order: not with --task link through the daemon" in capsys.readouterr().err
