"""What the operator sees of the read path (issue 30): every mode's reads timed and counted per file and purpose,
the feature bytes served and the read amplification, the samples published, and who the clients are."""

import os
import re
import socket
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from loader.daemon.metrics import DaemonMetrics
from loader.daemon.read_metrics import ClientInfo
from proto.messages import EpochEnd, EvalEnd, EvalRequest, StartEpoch
from tests.daemon_harness import connect, consume, daemon_config, running_daemon

ROW_BYTES = 16 * 4
"""``dataset_3k``'s rows: 16 float32 features."""

OUT_OF_CORE = {"neighbor_cache": 0, "feature_cache": 0}
"""Nothing cached: every list and row the full-graph modes need comes from disk (the tiny graph would otherwise fit
the caches whole and be read once, at startup)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def value(daemon, name, **labels):
    return daemon.metrics.registry.get_sample_value(name, labels) or 0.0


def summed(daemon, name, **labels):
    """Every sample of ``name`` whose labels include ``labels``, summed."""
    total = 0.0
    for family in daemon.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def served_bytes(batches):
    return sum(len(arrays["n_id"]) for _, arrays in batches) * ROW_BYTES


def seeds(batches):
    return sum(int(arrays["nodes_per_hop"][0]) for _, arrays in batches)


def mode_config(dataset: Path, tmp_path: Path, mode: str, **tables):
    fullgraph = dict(tables.pop("fullgraph", {}))
    if mode == "staged":
        (tmp_path / "staging").mkdir()
        fullgraph["staging_dir"] = str(tmp_path / "staging")
    return daemon_config(dataset, tmp_path / "s.sock", loader={"mode": mode}, fullgraph=fullgraph,
                         io={"check_reads": False} if mode == "mmap" else {}, **tables)


# the files each mode's training stream reads (mmap: none, its training reads are page faults of memory maps)
TRAIN_FILES = {
    "exact": {"features", "indices"},
    "static": {"features", "indices"},
    "staged": {"features", "indices", "staging"},
    "hybrid": {"features", "indices"},
    "hierarchical": {"features", "indices", "indptr"},
    "mmap": set(),
}
FULLGRAPH = {"exact": {"superbatch": 4, **OUT_OF_CORE}, "static": {"superbatch": 3, **OUT_OF_CORE},
             "staged": {"superbatch": 6, **OUT_OF_CORE}, "hybrid": {"superbatch": 4, **OUT_OF_CORE}}


@pytest.mark.parametrize("mode", sorted(TRAIN_FILES))
def test_every_mode_times_its_reads_and_counts_amplification_per_purpose(dataset_3k, reference_3k, tmp_path, mode):
    """After one training epoch and one validation pass: the read-latency histogram has a series for every file the
    mode's training stream reads and for evaluation's, served bytes are the published rows' bytes exactly, the
    samples are the split's nodes, and the amplification gauge is read bytes over served bytes, per purpose."""
    config = mode_config(dataset_3k, tmp_path, mode, fullgraph=FULLGRAPH.get(mode, {}))
    with running_daemon(config) as daemon, connect(config) as client:
        train, _ = consume(client, StartEpoch(epoch=0), EpochEnd)
        assert value(daemon, "megabatch_feature_bytes_served_total", purpose="train") == served_bytes(train)
        assert value(daemon, "megabatch_seeds_published_total", kind="train") == seeds(train) == \
            len(reference_3k.splits["train"])
        for file in TRAIN_FILES[mode]:
            assert value(daemon, "megabatch_disk_read_seconds_count", file=file, purpose="train") > 0, file
            assert value(daemon, "megabatch_disk_read_bytes_total", file=file, purpose="train") > 0, file
            assert value(daemon, "megabatch_disk_reads_total", file=file, purpose="train") > 0, file
        # the pipeline may go on reading (the next epoch's first superbatch, sampled ahead) while served bytes stay
        # put until the next StartEpoch: the gauge lies between the ratios before and after it
        read = summed(daemon, "megabatch_disk_read_bytes_total", purpose="train")
        ratio = value(daemon, "megabatch_read_amplification_ratio", purpose="train")
        read_after = summed(daemon, "megabatch_disk_read_bytes_total", purpose="train")
        assert (read > 0) == (mode != "mmap")
        assert read / served_bytes(train) <= ratio <= read_after / served_bytes(train)
        assert daemon.metrics.registry.get_sample_value("megabatch_read_amplification_ratio",
                                                        {"purpose": "eval"}) is None  # nothing served yet

        val, _ = consume(client, EvalRequest(split="val"), EvalEnd)
        assert value(daemon, "megabatch_feature_bytes_served_total", purpose="eval") == served_bytes(val)
        assert value(daemon, "megabatch_seeds_published_total", kind="val") == len(reference_3k.splits["val"])
        # every mode's evaluation reads lists and rows by checked preads (the in-memory mode aside)
        for file in ("features", "indices"):
            assert value(daemon, "megabatch_disk_read_seconds_count", file=file, purpose="eval") > 0, file
        # nothing reads for evaluation once its stream has ended
        assert value(daemon, "megabatch_read_amplification_ratio", purpose="eval") == pytest.approx(
            summed(daemon, "megabatch_disk_read_bytes_total", purpose="eval") / served_bytes(val))
        # the histogram's sub-millisecond buckets exist (a 4 KiB read takes tens of microseconds)
        assert daemon.metrics.registry.get_sample_value(
            "megabatch_disk_read_seconds_bucket", {"file": "features", "purpose": "eval", "le": "0.0001"}) is not None


def test_the_startup_cache_fill_is_not_the_training_streams(dataset_3k, tmp_path):
    """Mode static fills its degree-ranked feature cache at startup: those reads are purpose "startup", so the
    training stream's amplification is what its own reads cost."""
    config = mode_config(dataset_3k, tmp_path, "static", fullgraph={"superbatch": 3, "feature_cache": "40K"})
    with running_daemon(config) as daemon:
        assert value(daemon, "megabatch_disk_read_bytes_total", file="features", purpose="startup") > 0
        assert summed(daemon, "megabatch_disk_read_bytes_total", purpose="train") == 0


def test_client_info_is_one_series_per_connected_session():
    """Read from the server's live map of sessions at each scrape: a session that leaves the map leaves the
    metrics, and a session still in its handshake (no info yet) has none."""
    metrics = DaemonMetrics()
    sessions = {4: SimpleNamespace(client_info=ClientInfo(4, "trainer a", 1234, 1000, "", 0)),
                7: SimpleNamespace(client_info=ClientInfo(7, "rank 1", 99, 0, "h:29500", 1)),
                8: SimpleNamespace(client_info=None)}
    metrics.watch_clients(sessions)

    def infos():
        return sorted(tuple(sorted(s.labels.items())) for family in metrics.registry.collect()
                      for s in family.samples if s.name == "megabatch_client_info")

    assert infos() == [
        (("client", "rank 1"), ("job", "h:29500"), ("pid", "99"), ("rank", "1"), ("session", "7"), ("uid", "0")),
        (("client", "trainer a"), ("job", ""), ("pid", "1234"), ("rank", "0"), ("session", "4"), ("uid", "1000"))]
    del sessions[7]
    assert [dict(labels)["session"] for labels in infos()] == ["4"]


def test_status_json_of_a_live_daemon_has_every_documented_field(dataset_3k, tmp_path, capsys):
    """``megabatch status --json`` against a daemon in mode exact that trained an epoch: every field docs/DEPLOY.md
    lists is there and nothing else, the connected client is this process, and the numbers agree with the
    metrics."""
    import json

    from loader.cli import main

    port = free_port()
    config = mode_config(dataset_3k, tmp_path, "exact", fullgraph=FULLGRAPH["exact"], metrics={"port": port})
    url = f"http://127.0.0.1:{port}/metrics"
    with running_daemon(config) as daemon, connect(config) as client:
        train, _ = consume(client, StartEpoch(epoch=0), EpochEnd)
        capsys.readouterr()
        assert main(["status", "--url", url, "--json"]) == 0
        fields = json.loads(capsys.readouterr().out)
        assert main(["top", "--url", url, "--once"]) == 0
        frame = capsys.readouterr().out
        assert main(["status", "--url", url]) == 0
        text = capsys.readouterr().out
        plan = daemon.mode.budget_plan.total
    assert_documented(fields)
    assert (fields["dataset"], fields["mode"]) == (dataset_3k.name, "exact")
    assert fields["clients"] == [{"session": fields["clients"][0]["session"], "client": "test", "pid": os.getpid(),
                                  "uid": os.getuid(), "job": "", "rank": 0}]
    assert fields["memory"]["plan_bytes"] == plan <= fields["memory"]["budget_bytes"]
    assert fields["memory"]["resident_bytes"] > 0
    assert fields["window"]["basis"] == "uptime" and fields["window"]["seconds"] > 0
    assert fields["totals"]["batches"]["train"] == len(train)
    assert fields["totals"]["feature_bytes_served"]["train"] == served_bytes(train)
    assert fields["read_amplification"]["train"] == pytest.approx(
        fields["totals"]["disk_read_bytes"]["train"] / served_bytes(train))
    assert fields["read_latency_seconds"]["train"]["requests"] > 0
    assert 0 < fields["read_latency_seconds"]["train"]["p50"] <= fields["read_latency_seconds"]["train"]["p99"]
    assert fields["rates"]["batches_per_second"]["train"] > 0 and fields["rates"]["samples_per_second"]["train"] > 0
    assert fields["cache_hit_ratios"]["features"] == 0.0  # no feature cache: every row missed
    assert fields["slots"] == {"in_use": 0, "capacity": config.publisher.slots}
    lines = frame.splitlines()
    assert lines[0].startswith(f"megabatch {fields['version']}: dataset {dataset_3k.name}, mode exact, epoch 0")
    assert re.search(r"^train +[\d.,]+ batches/s, [\d,]+ samples/s, disk [\d.,]+ MB/s, amplification [\d.,]+x; "
                     r"reads [\d,]+, p50 ", frame, flags=re.MULTILINE), frame
    assert "\x1b" not in frame  # --once writes no escape codes
    assert re.search(r"^read amplification since start: train [\d.,]+x$", text, flags=re.MULTILINE), text


# --- docs/DEPLOY.md's list of the JSON fields ---------------------------------------------------------------------

def documented_paths() -> set[str]:
    """The fields the table under "megabatch status --json" lists: ``a.b`` for a nested key, ``a[].b`` for a key of
    every item of a list, ``{x,y}`` for each of several keys."""
    text = (Path(__file__).parents[3] / "docs" / "DEPLOY.md").read_text()
    section = text.split("\n### megabatch status --json\n", 1)[1].split("\n#", 1)[0]
    paths: set[str] = set()
    for field in re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE):
        expanded = [field]
        while any("{" in p for p in expanded):
            p = next(p for p in expanded if "{" in p)
            head, rest = p.split("{", 1)
            options, tail = rest.split("}", 1)
            expanded.remove(p)
            expanded += [head + option + tail for option in options.split(",")]
        paths.update(expanded)
    return paths


def paths_of(fields, prefix="") -> set[str]:
    """Every leaf of ``fields`` as ``documented_paths`` writes it (an empty list or map: its own path)."""
    if isinstance(fields, dict) and fields and prefix not in ("queues.", "quality."):
        return {p for key, item in fields.items() for p in paths_of(item, f"{prefix}{key}.")}
    if isinstance(fields, list) and fields:
        return {p for item in fields for p in paths_of(item, f"{prefix.rstrip('.')}[].")}
    return {prefix.rstrip(".")}


def assert_documented(fields) -> None:
    """Every field of ``fields`` is documented, and every documented field is there (a list of items that is empty
    here stands for its items' fields)."""
    documented, found = documented_paths(), paths_of(fields)
    empty_lists = {path for path in found if "[]" not in path and isinstance(leaf(fields, path), list)}
    missing = {path for path in documented - found if path.split("[]", 1)[0] not in empty_lists}
    undocumented = {path for path in found - documented
                    if not (path in empty_lists and any(d.startswith(path + "[]") for d in documented))}
    assert (missing, undocumented) == (set(), set())


def leaf(fields, path):
    for key in path.split("."):
        fields = fields[key]
    return fields


def test_the_documented_paths_expand_braces_and_lists():
    assert paths_of({"a": {"b": 1, "c": [{"d": 1}]}, "e": None, "queues": {"x": {"depth": 1}}}) == {
        "a.b", "a.c[].d", "e", "queues"}
    assert {"rates.batches_per_second.train", "clients[].pid", "training.waiting[].place",
            "read_latency_seconds.startup.p99"} <= documented_paths()


def sample_set(batches, seeds_, read, served, requests, started=1000.0):
    """A daemon's scrape in mode exact: its counters at these totals, six clients (their names with an escape)."""
    labels = {"purpose": "train"}
    s = {("megabatch_build_info", (("dataset", "products"), ("measures_quality", "false"), ("mode", "exact"),
                                   ("version", "1.2.3"))): 1.0,
         ("process_start_time_seconds", ()): started, ("process_resident_memory_bytes", ()): 5 << 30,
         ("megabatch_memory_budget_bytes", ()): 4 << 30, ("megabatch_memory_plan_bytes", ()): 3 << 30,
         ("megabatch_epoch", ()): 3.0, ("megabatch_slots_in_use", ()): 2.0, ("megabatch_slots_capacity", ()): 6.0,
         ("megabatch_queue_depth", (("queue", "sampled"),)): 1.0,
         ("megabatch_queue_capacity", (("queue", "sampled"),)): 1.0,
         ("megabatch_training_queue_position", (("trainer", "session 4"),)): 0.0,
         ("megabatch_training_queue_position", (("trainer", "job 'h:1'"),)): 1.0,
         ("megabatch_batches_published_total", (("kind", "train"),)): batches,
         ("megabatch_seeds_published_total", (("kind", "train"),)): seeds_,
         ("megabatch_disk_read_bytes_total", (("file", "features"), ("purpose", "train"))): read,
         ("megabatch_feature_bytes_served_total", tuple(labels.items())): served,
         ("megabatch_feature_cache_lookups_total", (("result", "hit"),)): 3.0 * batches,
         ("megabatch_feature_cache_lookups_total", (("result", "miss"),)): 1.0 * batches,
         ("megabatch_disk_read_seconds_count", (("file", "features"), ("purpose", "train"))): requests,
         ("megabatch_disk_read_seconds_sum", (("file", "features"), ("purpose", "train"))): requests * 4e-4}
    for le, share in (("0.0001", 0.0), ("0.00025", 0.5), ("0.0005", 0.9), ("0.001", 1.0), ("+Inf", 1.0)):
        s[("megabatch_disk_read_seconds_bucket", (("file", "features"), ("le", le), ("purpose", "train")))] = \
            share * requests
    for session in range(4, 10):
        s[("megabatch_client_info", (("client", f"trainer\x1b[2J{session}"), ("job", ""),
                                     ("pid", str(100 + session)), ("rank", "0"), ("session", str(session)),
                                     ("uid", "1000")))] = 1.0
    return s


def test_a_frame_at_a_fixed_size_from_fixed_samples():
    """``megabatch top``'s frame from a fixed set of samples, two scrapes 2 s apart, drawn at 72 x 14: its text,
    the live rates between the scrapes, and the client rows cut to the height with how many were left out."""
    from loader.daemon.status import status_fields
    from loader.daemon.top import render_top


    before = sample_set(batches=100, seeds_=6400, read=80e6, served=10e6, requests=1000)
    after = sample_set(batches=120, seeds_=7680, read=100e6, served=12e6, requests=1200)
    fields = status_fields(after, now=1130.0, previous=(before, 1128.0))
    frame = render_top(fields, width=72, height=14)
    assert frame.splitlines() == [
        "megabatch 1.2.3: dataset products, mode exact, epoch 3, up 0:02:10",
        "memory   resident 5 GiB of budget 4 GiB (plan 3 GiB; 1 GiB over the budg",
        "rates    over the last 2.0 s",
        "train    10.0 batches/s, 640 samples/s, disk 10.0 MB/s, amplification 10",
        "eval     0.0 batches/s, 0 samples/s, disk 0.0 MB/s; reads 0, p50 -, p99 ",  # cut at the width
        "disk     10.0 MB/s read in all",
        "caches   hit ratio: features 0.750, neighbour lists -, client caches -",
        "slots    2 of 6 in use; queues: sampled 1/1",
        "training session 4; waiting: job 'h:1' (1)",
        "clients  6 connected",
        "  SESSION       PID     UID  JOB               RANK  CLIENT",
        "        4       104    1000  -                    0  trainer?[2J4",
        "        5       105    1000  -                    0  trainer?[2J5",
        "  ... 4 more",
    ]
    assert fields["read_amplification"]["train"] == pytest.approx(10.0)
    assert fields["read_latency_seconds"]["train"]["p50"] == pytest.approx(2.5e-4)
    assert fields["read_latency_seconds"]["train"]["p99"] == pytest.approx(5e-4 + 5e-4 * 0.9)
    # the first frame (no scrape before it): over the daemon's uptime
    first = status_fields(after, now=1130.0)
    assert first["window"] == {"basis": "uptime", "seconds": 130.0}
    assert first["rates"]["batches_per_second"]["train"] == pytest.approx(120 / 130)
    assert "since the daemon started" in render_top(first, 80, 40)
    # a daemon restarted between the scrapes: its counters started again, so no difference is a rate
    restarted = status_fields(sample_set(5, 320, 1e6, 1e5, 10, started=1129.0), now=1130.0, previous=(after, 1128.0))
    assert restarted["window"] == {"basis": "uptime", "seconds": 1.0}
    assert np.all([len(line) <= 72 for line in frame.splitlines()])


def test_top_redraws_in_place_with_live_rates_and_survives_a_lost_daemon(monkeypatch):
    """On a terminal: each frame drawn from the cursor's home, lines cleared as they are overwritten; the second
    frame's rates between the two scrapes; a scrape that fails later is a frame saying so, not an exit; Ctrl-C
    leaves with 0."""
    import io

    from loader.daemon import top
    from proto.errors import UserError

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    scrapes = iter([sample_set(100, 6400, 80e6, 10e6, 1000), sample_set(120, 7680, 100e6, 12e6, 1200),
                    UserError("gone"), KeyboardInterrupt()])

    def read(url):
        got = next(scrapes)
        if isinstance(got, BaseException):
            raise got
        return got

    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("LINES", "40")
    out = Terminal()
    assert top.run_top("http://daemon/metrics", interval=0.001, once=False, out=out, read=read) == 0
    frames = out.getvalue().split(top.HOME)[1:]
    assert len(frames) == 3
    assert "since the daemon started" in frames[0] and "over the last" in frames[1]
    assert frames[2].startswith("megabatch top: cannot read http://daemon/metrics (retrying every 0.001 s)")
    frames[-1] = frames[-1].removesuffix("\n")  # the line Ctrl-C leaves the shell's prompt on
    assert all(frame.endswith(top.CLEAR_LINE + "\n" + top.CLEAR_BELOW) for frame in frames)
    assert "trainer?[2J4" in frames[0] and "\x1b[2J" not in frames[0]
