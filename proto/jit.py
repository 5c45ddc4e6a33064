"""The decorator of every numba kernel (the loader's and the trainer's): nopython, GIL released, compiled once
into numba's cache. In ``proto``, which both packages import, so that the trainer needs no ``loader`` for it.

Compiling in the process costs seconds at every daemon start, and LLVM keeps ~70 MiB it never
returns (docs/PERFORMANCE.md, "Daemon memory in the exact mode"), so kernels are cached on disk:
in ``NUMBA_CACHE_DIR`` when set (the systemd unit sets it), else next to the module
(``__pycache__``), else in the user's cache directory. Where none is writable (a read-only install
run by a user without a home) numba refuses ``cache=True`` when the function is decorated; the
kernel is then compiled in each process instead, with one warning.
"""

import logging
from collections.abc import Callable
from typing import TypeVar, cast

import numba

__all__ = ["kernel"]

log = logging.getLogger("megabatch.jit")

F = TypeVar("F", bound=Callable[..., object])

_warned = False


def kernel(fn: F) -> F:
    """``numba.njit(nogil=True, cache=True)``, or ``cache=False`` where numba has nowhere to cache."""
    global _warned
    try:
        return cast(F, numba.njit(nogil=True, cache=True)(fn))
    except RuntimeError as err:
        if "cannot cache" not in str(err):
            raise
        if not _warned:
            _warned = True
            log.warning("numba has no writable cache directory (%s): kernels compile in every process; set "
                        "NUMBA_CACHE_DIR to a writable directory", err)
        return cast(F, numba.njit(nogil=True, cache=False)(fn))
