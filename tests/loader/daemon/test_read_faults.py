"""Disk faults on the read path: EIO from a read, and dataset files changed under a running daemon.

EIO comes from a fault-injecting layer at the read call: ``os.preadv`` (the hierarchical reader and
the neighbour-list reader) wrapped to fail on one file's descriptor, and the row reader's numba kernel
wrapped to report EIO, the way ``pread`` does. Each fault must fail only the stream that needed the
bytes, with one line naming the file and byte, and leave the daemon serving: the next epoch, the fault
gone, is whole and correct. Files changed under the daemon are changed in place, as an operator's
mistake would (``os.truncate``, a write into the file), for training and evaluation streams alike.
"""

import errno
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from loader.caches import row_reader_kernels as kernels
from loader.format.dataset import open_dataset
from loader.format.npyio import NpyReader
from proto.client import ControlClient
from proto.errors import RemoteError, UserError
from proto.messages import BatchReady, EpochEnd, EvalEnd, EvalRequest, Message, Release, StartEpoch
from tests.daemon_harness import connect, consume, daemon_config, running_daemon, train_until_error

MODES = {
    "hierarchical": {},
    # no caches: every row and list of the epoch comes through the readers under test
    "exact": {"loader": {"mode": "exact"}, "fullgraph": {"neighbor_cache": 0, "feature_cache": 0}},
    # every row through the staging pass (its chunk reads), every list from disk
    "staged": {"loader": {"mode": "staged"}, "fullgraph": {"neighbor_cache": 0, "feature_cache": 0}},
    # room for every partition: rows through the partitions' pass where they are worth it, the rest read
    "hybrid": {"loader": {"mode": "hybrid"}, "fullgraph": {"neighbor_cache": 0, "feature_cache": "64M"}},
}

CHANGED_MODES = ("hierarchical", "exact", "staged", "hybrid")
"""The modes the files-changed-under-the-daemon matrix runs, one per kind of read path: whole partitions, rows and
lists at random, staging passes, partitions loaded whole beside a row cache (mode static reads as exact does)."""

STREAMS = {"train": (lambda: StartEpoch(epoch=0), EpochEnd), "val": (lambda: EvalRequest(split="val"), EvalEnd)}


def changed_config(dataset: Path, sock: Path, mode: str):
    """``mode`` where both files are still read after a stream's first batch has arrived, until the client releases
    it: the full-graph modes sample superbatches of 2 batches, 3 in flight (batches 8 on are sampled and staged
    after a release), the hierarchical mode loads its third mega-batch of 4 once the first one's batches are out,
    and evaluation batches hold 8 seeds (75 validation batches, sampled 32 at a time, rows read per batch)."""
    tables = MODES[mode]
    return daemon_config(dataset, sock, **{**tables, "fullgraph": {**tables.get("fullgraph", {}), "superbatch": 2},
                                           "sampler": {"eval_batch_size": 8}})


class Faults:
    """How many reads of ``file`` still fail with EIO (shared by the injected wrappers, which the daemon's read
    threads call at once: the count is taken under a lock, or two reads could both take the last fault)."""

    def __init__(self, file: str, count: int) -> None:
        self.file, self.left, self.hits = file, count, 0
        self._lock = threading.Lock()

    def take(self, fd: int) -> bool:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(self.file):
            return False
        with self._lock:
            if self.left <= 0:
                return False
            self.left -= 1
            self.hits += 1
            return True


def inject_eio(monkeypatch, faults: Faults) -> None:
    real_preadv, real_kernel = os.preadv, kernels.read_groups

    def preadv(fd, buffers, offset, *rest):
        if faults.take(fd):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_preadv(fd, buffers, offset, *rest)

    def read_groups(fd, *args):
        if faults.take(fd):
            # read_groups(fd, span_start, ..., bounce, g0, g1, result, block_sums, check_block)
            result, span_start, g0 = args[12], args[0], args[10]
            result[:] = (kernels.STATUS_OS_ERROR, errno.EIO, 1, 0, span_start[g0])
            return
        real_kernel(fd, *args)

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(kernels, "read_groups", read_groups)


def assert_whole_epoch(config, reference) -> None:
    """A fresh client trains epoch 0 end to end: every seq once, every feature row the dataset's."""
    with connect(config) as client:
        batches, end = consume(client, StartEpoch(epoch=0), EpochEnd)
    assert [ready.seq for ready, _ in batches] == list(range(end.batches))
    for _, arrays in batches:
        np.testing.assert_array_equal(arrays["x"], reference.features[arrays["n_id"]])


@pytest.mark.parametrize("file", ["features.bin", "indices.npy"])
@pytest.mark.parametrize("mode", list(MODES))
def test_eio_fails_the_stream_with_file_and_byte_and_the_daemon_serves_on(dataset_3k, reference_3k, tmp_path,
                                                                          monkeypatch, mode, file):
    faults = Faults(file, 1)
    config = daemon_config(dataset_3k, tmp_path / "s.sock", **MODES[mode])
    with running_daemon(config):
        inject_eio(monkeypatch, faults)
        with connect(config) as client:
            err = train_until_error(client)
        assert faults.hits == 1
        assert err.code == "internal"
        assert file in err.message and "Input/output error" in err.message and "at byte" in err.message
        assert "\n" not in err.message
        assert_whole_epoch(config, reference_3k)  # the fault was transient: served whole and correct


def test_a_file_overwritten_in_place_under_the_daemon_is_caught_by_the_read_checks(dataset_3k, reference_3k, tmp_path):
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    config = daemon_config(copy, tmp_path / "s.sock")
    with running_daemon(config):
        assert_whole_epoch(config, reference_3k)
        with open(copy / "features.bin", "r+b") as handle:  # another process rewrites a page in place
            handle.write(b"\x7f" * 4096)
        with connect(config) as client:
            err = train_until_error(client)
        assert err.code == "data_corrupt" and "features.bin" in err.message


def stream_until_error(client: ControlClient, request: Message, after_first: Callable[[], None]
                       ) -> tuple[list[dict[str, np.ndarray]], RemoteError]:
    """Run one stream, calling ``after_first`` once its first batch has arrived (before releasing it), until the
    daemon's ``Error`` ends it: the batches received (copies) and that error. A stream that ends well fails here."""
    client.send(request)
    batches: list[dict[str, np.ndarray]] = []
    try:
        while True:
            msg = client.recv(timeout=60)
            assert isinstance(msg, BatchReady), f"the stream ended without an error after {len(batches)} batches"
            batches.append({k: np.array(v) for k, v in client.read_batch(msg).arrays.items()})
            if len(batches) == 1:
                after_first()
            client.send(Release(slot=msg.slot, seq=msg.seq))
    except RemoteError as err:
        return batches, err


@pytest.mark.parametrize("file", ["features.bin", "indices.npy"])
@pytest.mark.parametrize("stream", list(STREAMS))
@pytest.mark.parametrize("mode", CHANGED_MODES)
def test_a_file_truncated_mid_stream_fails_that_stream_in_one_line_and_the_daemon_serves_on(
        dataset_3k, reference_3k, tmp_path, mode, stream, file):
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    original = (copy / file).read_bytes()
    config = changed_config(copy, tmp_path / "s.sock", mode)
    with running_daemon(config):
        with connect(config) as client:
            received, err = stream_until_error(client, STREAMS[stream][0](), lambda: os.truncate(copy / file, 4096))
        assert len(received) >= 1
        assert err.code == "internal" and "\n" not in err.message
        assert str(copy / file) in err.message and re.search(r"\bat (?:byte |offset )?\d+", err.message), err.message
        with open(copy / file, "r+b") as handle:  # repaired in place: the daemon still holds the file open
            handle.write(original)
        assert_whole_epoch(config, reference_3k)  # another client, served whole and correct


def flip_offset(dataset: Path, file: str, split: str) -> int:
    """A byte of ``file`` that a stream over ``split`` reads: its first node's feature row, or the first node's
    in-neighbour list (of at most 3 entries, so that every sampler takes all of it)."""
    ds = open_dataset(dataset)
    nodes = ds.read(split)
    if file == "features.bin":
        parts = ds.partitions()
        p = int(parts.partition_of(nodes[:1])[0])
        return int(parts.feat_offset[p] + (nodes[0] - parts.node_begin[p]) * ds.manifest.row_bytes)
    indptr = ds.read("indptr")
    degree = indptr[nodes + 1] - indptr[nodes]
    node = nodes[np.flatnonzero((degree >= 1) & (degree <= 3))[0]]
    with NpyReader(ds.file("indices")) as header:
        return header.data_offset + int(indptr[node]) * header.dtype.itemsize


def flip_byte(path: Path, at: int) -> None:
    """Change the byte at ``at`` in place, as another process writing into the file would."""
    with open(path, "r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)[0]
        handle.seek(at)
        handle.write(bytes([byte ^ 0x5A]))


@pytest.mark.parametrize("file", ["features.bin", "indices.npy"])
@pytest.mark.parametrize("stream", list(STREAMS))
@pytest.mark.parametrize("mode", CHANGED_MODES)
def test_a_flipped_byte_reaches_no_batch_of_any_stream(dataset_3k, tmp_path, mode, stream, file):
    """A byte the stream reads, flipped after a clean run of it: the stream fails with ``data_corrupt`` naming the
    file, and every batch served before that is the clean run's."""
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    request, end = STREAMS[stream]
    config = daemon_config(copy, tmp_path / "s.sock", **MODES[mode])
    with running_daemon(config):
        with connect(config) as client:
            clean, _ = consume(client, request(), end)
        flip_byte(copy / file, flip_offset(copy, file, "train" if stream == "train" else "val"))
        with connect(config) as client:
            served, err = stream_until_error(client, request(), lambda: None)
    assert err.code == "data_corrupt" and str(copy / file) in err.message, err.message
    for arrays, (_, want) in zip(served, clean):
        assert arrays.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(arrays[name], want[name], err_msg=name)


def test_a_file_replaced_by_rename_under_the_daemon_keeps_serving_the_open_one(dataset_3k, reference_3k, tmp_path):
    """The daemon holds its files open: a dataset replaced by rename (how prepare and rsync publish) is
    picked up at the next start; until then the old, consistent bytes are served."""
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    config = daemon_config(copy, tmp_path / "s.sock")
    with running_daemon(config):
        replacement = copy / "features.bin.new"
        replacement.write_bytes(bytes((copy / "features.bin").stat().st_size))
        os.replace(replacement, copy / "features.bin")
        assert_whole_epoch(config, reference_3k)


@pytest.mark.parametrize("call, names", [
    ("pwrite", "staging in {dir}"),  # the feature rows staged per batch
    ("pwritev", "spilling sampled batches in {dir}"),  # each sample group's edges, spilled
], ids=["rows", "edges"])
def test_a_full_staging_disk_fails_the_stream_in_one_line_and_the_daemon_serves_on(dataset_3k, reference_3k, tmp_path,
                                                                                     monkeypatch, call, names):
    """Mode staged writes its staged rows with ``os.pwrite`` and spills sampled edges with ``os.pwritev``: ENOSPC
    on either names the staging directory (and what it was writing), fails that stream only, and the next epoch,
    space back, is whole and correct."""
    left = [1]
    real = getattr(os, call)
    counting = threading.Lock()  # the stager's writes come from several threads at once: exactly one fails

    def failing(fd, data, offset):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / "staging")):
            with counting:
                fail = left[0] > 0
                left[0] -= fail
            if fail:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, offset)

    (tmp_path / "staging").mkdir()
    config = daemon_config(dataset_3k, tmp_path / "s.sock", **{**MODES["staged"], "fullgraph": {
        **MODES["staged"]["fullgraph"], "staging_dir": str(tmp_path / "staging")}})
    with running_daemon(config):
        monkeypatch.setattr(os, call, failing)
        with connect(config) as client:
            err = train_until_error(client)
        assert left[0] == 0
        assert err.code == "internal" and "\n" not in err.message
        assert names.format(dir=tmp_path / "staging") in err.message and "No space left on device" in err.message
        assert_whole_epoch(config, reference_3k)


def test_mode_mmap_runs_only_with_the_checks_turned_off_warns_and_evaluates_through_preads(dataset_3k, tmp_path,
                                                                                          caplog):
    """Mode mmap maps the files for training (a baseline, by definition): it cannot check what it serves, and a
    shrinking file would kill the daemon, so it refuses to start while [io] check_reads is on (the default),
    in one line. Turned off, it says what that costs; its evaluation still reads through preads, so a file
    that shrinks fails only that stream."""
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    with pytest.raises(UserError, match=r"mode = \"mmap\" .*set \[io\] check_reads = false"), \
            running_daemon(daemon_config(copy, tmp_path / "s.sock", loader={"mode": "mmap"})):
        pass
    config = daemon_config(copy, tmp_path / "s.sock", loader={"mode": "mmap"}, io={"check_reads": False})
    caplog.set_level(logging.WARNING, logger="megabatch.mmap")
    with running_daemon(config):
        assert any("memory maps" in r.getMessage() and "SIGBUS" in r.getMessage() for r in caplog.records)
        os.truncate(copy / "features.bin", 4096)
        with connect(config) as client:
            _, err = stream_until_error(client, EvalRequest(split="val"), lambda: None)
        assert str(copy / "features.bin") in err.message and "\n" not in err.message, err.message
        with connect(config) as client:  # the daemon is still up
            assert client.welcome.dataset.mode == "mmap"
