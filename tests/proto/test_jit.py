"""proto.jit.kernel: cached where numba can cache, compiled per process (one warning) where it cannot."""

import logging

import numba
import numpy as np
import pytest

import proto.jit as jit


def _double(x: np.ndarray) -> np.ndarray:
    return x * 2


def test_kernel_caches_by_default() -> None:
    compiled = jit.kernel(_double)
    assert compiled.targetoptions["nogil"] is True
    np.testing.assert_array_equal(compiled(np.arange(3)), [0, 2, 4])
    assert compiled.stats.cache_path is not None  # numba's public compile stats: a cache directory is in use


def test_kernel_without_a_cache_directory_compiles_per_process(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    real = numba.njit

    def njit(**options: object):  # what numba does when no locator is writable
        if options.get("cache"):
            raise RuntimeError("cannot cache function '_double': no locator available for file 'x.py'")
        return real(**options)

    monkeypatch.setattr(jit.numba, "njit", njit)
    monkeypatch.setattr(jit, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="megabatch.jit"):
        first, second = jit.kernel(_double), jit.kernel(_double)
    assert [r.message for r in caplog.records if "NUMBA_CACHE_DIR" in r.message] != []
    assert len(caplog.records) == 1  # one warning per process, not per kernel
    np.testing.assert_array_equal(first(np.arange(3)), [0, 2, 4])
    np.testing.assert_array_equal(second(np.arange(3)), [0, 2, 4])
    assert first.stats.cache_path is None  # compiled in this process, cached nowhere


def test_kernel_passes_other_errors_through(monkeypatch: pytest.MonkeyPatch) -> None:
    def njit(**options: object):
        raise RuntimeError("something else")

    monkeypatch.setattr(jit.numba, "njit", njit)
    with pytest.raises(RuntimeError, match="something else"):
        jit.kernel(_double)
