"""Scratch files kept for reuse: taken back in order of size, grown on demand, never more than asked, never in RAM,
and closed with the pool."""

import os

import pytest

from loader.staging.scratch_files import ScratchFiles


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_given_back_files_are_taken_again_and_grown(tmp_path, direct):
    files = ScratchFiles(tmp_path, direct_reads=direct, direct_writes=direct, keep=2)
    a, b, c = files.take(8192), files.take(4096), files.take(4096)
    assert files.held_bytes == 16384
    for f in (b, a, c):  # a third one given back finds no room: closed
        files.give(f)
    assert files.kept == 2 and c.fd == -1 and is_open(a.fd) and is_open(b.fd)
    assert files.held_bytes == 12288  # the closed one no longer counts, the kept ones do
    assert files.take(4096) is a  # the largest first
    grown = files.take(16384)  # b, grown
    assert grown is b and b.size == 16384 and os.fstat(b.fd).st_size == 16384
    assert files.held_bytes == 8192 + 16384
    files.give(a)
    files.close()
    assert a.fd == -1 and a.read_fd == -1
    files.give(b)  # given back after close: closed
    assert b.fd == -1 and files.kept == 0 and files.held_bytes == 0
    assert not list(tmp_path.iterdir())  # unnamed files: nothing to leave behind


def test_files_in_ram_are_never_kept():
    files = ScratchFiles(None, direct_reads=True, direct_writes=True, keep=3)
    f = files.take(4096)
    assert not f.direct_writes
    files.give(f)
    assert files.kept == 0 and f.fd == -1
