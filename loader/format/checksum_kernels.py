"""numba kernels of the read checks: XXH3-64 of fixed-size blocks, computed and compared without the GIL.

A block checksum is XXH3-64 (seed 0, default secret) of one block of a file: 4096-byte pages, or for
``features.bin`` (format 1.2) blocks sized to its rows, 512 to 4096 bytes, a power of two
(``check_block_bytes``); the last block of a file whose length is not a multiple of the block size is
hashed as if zero-padded. Every input is therefore 512 to 4096 bytes, which takes only XXH3's
long-input path (inputs over 240 bytes), so that path is all this module implements. The values equal
``xxhash.xxh3_64_intdigest(block)`` (tests/loader/format/test_read_checks.py checks that against the library).

Where it can, a block is hashed by the C function ``XXH3_64bits`` that the ``xxhash`` wheel's
extension module exports (12 GB/s with its SIMD code, against 3.8 GB/s for the numba
implementation here: at the row readers' ~100k scattered pages/s on 2 cores that was 17% of the
read rate against a few percent). Not a Python call per block: that would hold the GIL on the read
threads. The kernels call it by name (``numba.types.ExternalFunction``), and the name is bound to
the function's address in LLVM's symbol table at import, so the compiled kernels carry no address
and stay in numba's disk cache (a ctypes call would embed the address, which moves with every
process, forcing a compile per daemon start and ~70 MiB of LLVM memory the daemon keeps). Where
the symbol is missing (an xxhash built another way) the numba implementation serves.

Integer arithmetic is uint64 throughout (numba turns uint64 mixed with int64 into float64), so every
constant is a ``np.uint64``.
"""

import ctypes
import importlib.util
from typing import Any

import numba
import numpy as np
from llvmlite import binding as llvm

from proto.jit import kernel

__all__ = ["PAGE_BYTES", "MIN_BLOCK_BYTES", "check_block_bytes", "block_checksums", "first_bad_block",
           "bad_block_in", "first_bad_row", "USING_C_XXH3"]

PAGE_BYTES = 4096
"""The block of ``indices.npy``'s checks (and of ``features.bin``'s in format 1.1), and the largest block."""

MIN_BLOCK_BYTES = 512
"""The smallest block: XXH3's long path starts above 240 bytes, and a smaller block would only grow the table."""


def check_block_bytes(row_bytes: int) -> int:
    """The check block of a file of ``row_bytes`` rows: the largest power of two <= a row, in [512, 4096].

    A row-granular reader hashes the blocks its row touches; a 4 KiB page per 1 KiB row hashed four
    times the bytes used (docs/PERFORMANCE.md, "What the read checks cost"). The table costs 8 B per
    block: 1.6% of the file at 512, 0.2% at 4096, held in RAM and charged to the memory plan.
    """
    block = MIN_BLOCK_BYTES
    while block * 2 <= min(row_bytes, PAGE_BYTES):
        block *= 2
    return block

_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")
"""XXH3's 192-byte default secret (``XXH3_kSecret``), a constant of the algorithm."""


def _secret_words(at: int, count: int) -> np.ndarray:
    """``count`` little-endian uint64 read from the secret at byte ``at`` (not necessarily aligned)."""
    return np.frombuffer(_SECRET[at:at + 8 * count], dtype="<u8").astype(np.uint64)


_STRIPE_KEYS = np.stack([_secret_words(8 * s, 8) for s in range(16)])
"""Per stripe s of a 1024-byte block: the 8 secret words it is keyed with (secret advances 8 bytes)."""
_SCRAMBLE_KEYS = _secret_words(192 - 64, 8)
_LAST_KEYS = _secret_words(192 - 64 - 7, 8)
_MERGE_KEYS = _secret_words(11, 8)
_INIT = np.array([0xC2B2AE3D, 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                  0x85EBCA77C2B2AE63, 0x85EBCA77, 0x27D4EB2F165667C5, 0x9E3779B1], dtype=np.uint64)

_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_PRIME32_1 = np.uint64(0x9E3779B1)
_PRIME64_1 = np.uint64(0x9E3779B185EBCA87)
_PRIME_MX1 = np.uint64(0x165667919E3779F9)


@kernel
def _fold_mul(a: np.uint64, b: np.uint64) -> np.uint64:
    """Low 64 bits XOR high 64 bits of the 128-bit product a * b, from 32-bit halves."""
    a_lo, a_hi = a & _M32, a >> _S32
    b_lo, b_hi = b & _M32, b >> _S32
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    hi_hi = a_hi * b_hi
    cross = (lo_lo >> _S32) + (hi_lo & _M32) + lo_hi
    upper = (hi_lo >> _S32) + (cross >> _S32) + hi_hi
    lower = (cross << _S32) | (lo_lo & _M32)
    return lower ^ upper


@kernel
def _accumulate(acc: np.ndarray, words: np.ndarray, at: int, keys: np.ndarray) -> None:
    """One 64-byte stripe (8 words from ``words[at]``) into the 8 accumulators.

    XXH3 adds word i to lane i ^ 1 and the keyed product to lane i; one sum per lane is the same
    arithmetic and leaves LLVM a loop it can schedule without store-to-load chains (4.4 GB/s here
    against 3.4 for the two-statement form).
    """
    for i in range(8):
        key = words[at + i] ^ keys[i]
        acc[i] += (key & _M32) * (key >> _S32) + words[at + (i ^ 1)]


@kernel
def _block_hash(words: np.ndarray, at: int, nbytes: int, acc: np.ndarray) -> np.uint64:
    """XXH3-64 of the ``nbytes`` (a multiple of 64, over 240) bytes ``words[at:at + nbytes // 8]``.

    XXH3's long path: blocks of 16 stripes of 64 bytes, each block followed by a scramble; then the
    stripes left before the last byte; then one stripe ending at the last byte, keyed apart. 4096
    bytes are 3 blocks, 15 stripes and the last; 1024 bytes are 15 stripes and the last.
    """
    acc[:] = _INIT
    blocks = (nbytes - 1) // 1024
    for block in range(blocks):
        for s in range(16):
            _accumulate(acc, words, at + block * 128 + s * 8, _STRIPE_KEYS[s])
        for i in range(8):
            a = acc[i]
            a ^= a >> np.uint64(47)
            a ^= _SCRAMBLE_KEYS[i]
            acc[i] = a * _PRIME32_1
    for s in range(((nbytes - 1) - 1024 * blocks) // 64):
        _accumulate(acc, words, at + blocks * 128 + s * 8, _STRIPE_KEYS[s])
    _accumulate(acc, words, at + nbytes // 8 - 8, _LAST_KEYS)
    h = np.uint64(nbytes) * _PRIME64_1
    for i in range(4):
        h += _fold_mul(acc[2 * i] ^ _MERGE_KEYS[2 * i], acc[2 * i + 1] ^ _MERGE_KEYS[2 * i + 1])
    h ^= h >> np.uint64(37)
    h *= _PRIME_MX1
    h ^= h >> _S32
    return h


@kernel
def _numba_hash_block_at(data: np.ndarray, start: int, available: int, block: int, acc: np.ndarray,
                         pad: np.ndarray) -> np.uint64:
    """Hash the ``block`` bytes at ``data[start:]``; fewer ``available`` bytes are zero-padded."""
    if available >= block and start % 8 == 0 and len(data) % 8 == 0:
        return _block_hash(data.view(np.uint64), start // 8, block, acc)
    pad[:block] = 0
    take = min(available, block)
    pad[:take] = data[start:start + take]
    return _block_hash(pad.view(np.uint64), 0, block, acc)


def _c_xxh3() -> Any:
    """``XXH3_64bits(address, length)`` as an external function numba links by name, or None."""
    spec = importlib.util.find_spec("xxhash._xxhash")
    if spec is None or spec.origin is None:
        return None
    try:
        address = ctypes.cast(ctypes.CDLL(spec.origin).XXH3_64bits, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    llvm.add_symbol("XXH3_64bits", address)
    # a pointer passed as uintp: the same register and width under the x86-64 and AArch64 C ABIs
    return numba.types.ExternalFunction("XXH3_64bits", numba.types.uint64(numba.types.uintp, numba.types.uintp))


_XXH3 = _c_xxh3()
USING_C_XXH3 = _XXH3 is not None
"""True when pages are hashed by the xxhash library's C code (False: the numba implementation)."""

if _XXH3 is not None:
    @kernel
    def _hash_block_at(data: np.ndarray, start: int, available: int, block: int, acc: np.ndarray,
                       pad: np.ndarray) -> np.uint64:
        if available >= block:
            return _XXH3(data.ctypes.data + start, block)
        pad[:block] = 0
        pad[:available] = data[start:start + available]
        return _XXH3(pad.ctypes.data, block)
else:
    _hash_block_at = _numba_hash_block_at


@kernel
def block_checksums(data: np.ndarray, out: np.ndarray, block: int, numba_only: bool = False) -> None:
    """``out[k]`` = checksum of block k of ``data`` (uint8, C-contiguous); ``len(out)`` = ceil(len / block).

    ``numba_only``: hash with the numba implementation even where the C one is found (the fallback's
    test against the library).
    """
    acc = np.empty(8, dtype=np.uint64)
    pad = np.empty(PAGE_BYTES, dtype=np.uint8)
    for k in range(len(out)):
        start = k * block
        if numba_only:
            out[k] = _numba_hash_block_at(data, start, len(data) - start, block, acc, pad)
        else:
            out[k] = _hash_block_at(data, start, len(data) - start, block, acc, pad)


@kernel
def bad_block_in(data: np.ndarray, start: int, length: int, file_offset: int, sums: np.ndarray, block: int,
                 acc: np.ndarray, pad: np.ndarray) -> int:
    """File offset of the first bad block of one range, or -1.

    ``data[start:start + length]`` holds the file's bytes from ``file_offset`` (block aligned); it is a
    whole number of blocks, or ends where the file ends (that last block counts as zero-padded).
    ``acc`` (8 uint64) and ``pad`` (4096 uint8) are the caller's scratch.
    """
    for k in range((length + block - 1) // block):
        available = min(block, length - k * block)
        if _hash_block_at(data, start + k * block, available, block, acc, pad) != sums[file_offset // block + k]:
            return file_offset + k * block
    return -1


@kernel
def first_bad_block(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, file_offsets: np.ndarray,
                    sums: np.ndarray, block: int) -> int:
    """File offset of the first block of ranges r (as in ``bad_block_in``) that fails ``sums``, or -1."""
    acc = np.empty(8, dtype=np.uint64)
    pad = np.empty(PAGE_BYTES, dtype=np.uint8)
    for r in range(len(starts)):
        at = bad_block_in(data, starts[r], lengths[r], file_offsets[r], sums, block, acc, pad)
        if at >= 0:
            return at
    return -1


@kernel
def first_bad_row(rows: np.ndarray, dest: np.ndarray, offsets: np.ndarray, sums: np.ndarray, block: int) -> int:
    """File offset of the first block of rows ``rows[dest[k]]`` (uint8, 2-D, C-contiguous) that fails ``sums``,
    or -1.

    Row k holds the file's bytes from ``offsets[k]``, a multiple of ``block``, and its length is a whole
    number of blocks: each block of it is checked against ``sums[offset // block + j]``.
    """
    acc = np.empty(8, dtype=np.uint64)
    pad = np.empty(PAGE_BYTES, dtype=np.uint8)
    width = rows.shape[1]
    flat = rows.reshape(-1)
    for k in range(len(dest)):
        start = dest[k] * width
        first = offsets[k] // block
        for j in range(width // block):
            if _hash_block_at(flat, start + j * block, block, block, acc, pad) != sums[first + j]:
                return offsets[k] + j * block
    return -1
