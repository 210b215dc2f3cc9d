"""A keyed, versioned bijection on ``[0, n)`` with O(1) memory: the data plane's shuffle.

The permutation is a Feistel network on exactly ``w = bit_length(n - 1)`` bits (so ``2**w >= n``
for every ``n >= 1``, unlike a width that rounds down and loses an index at ``n = 2**k + 1``),
made a bijection on ``[0, n)`` by cycle-walking: an output ``>= n`` is encrypted again until it
lands in range. Each Feistel round is a bijection on ``[0, 2**w)`` whatever its round function,
so the whole map is one too; the cycle through ``x`` returns to ``[0, n)`` because ``x`` itself is
in range.

The halves may differ by one bit (``w`` odd): even rounds update the high half from the low half,
odd rounds the low half from the high half, each masked to the width of the half it updates.

Round keys are a BLAKE2b hash of the canonical JSON of ``(algorithm version, salt, seed, epoch,
n)``: an unambiguous encoding, so ``(seed s, epoch e+1)`` and ``(seed s+1, epoch e)`` give
unrelated permutations. Changing the algorithm in any way that changes outputs must bump
:data:`PERMUTATION_VERSION` (golden values in the tests pin it).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from hpcrun.errors import ArgumentError, OutOfRangeError

__all__ = ["PERMUTATION_VERSION", "Permutation", "derive_round_keys"]

PERMUTATION_VERSION = 1
"""Version of the permutation algorithm; part of every round key and of the data cursor."""

ROUNDS = 8
"""Feistel rounds (even, so both halves are updated the same number of times)."""

_CHUNK = 131_072
"""Elements processed per vectorized pass (1 MiB per uint64 array): large enough to amortize
the Python overhead of cycle-walking tails, small enough that memory is independent of ``n``."""


def derive_round_keys(*, n: int, seed: int, epoch: int, salt: str = "") -> np.ndarray:
    """Return the round keys of one permutation: row 0 xor keys, row 1 odd multipliers.

    Args:
        n: Size of the domain.
        seed: User seed.
        epoch: Epoch number; each epoch is an unrelated permutation.
        salt: Domain separation (e.g. dataset ID and source name).

    Returns:
        A ``uint64`` array of shape ``(2, ROUNDS)``.
    """
    material = json.dumps(["hpcrun.permutation", PERMUTATION_VERSION, salt, seed, epoch, n],
                          separators=(",", ":")).encode()
    rows = [np.frombuffer(hashlib.blake2b(material, digest_size=8 * ROUNDS, person=tag).digest(),
                          dtype="<u8") for tag in (b"xor", b"mul")]
    keys = np.stack(rows).astype(np.uint64)
    keys[1] |= np.uint64(1)  # multipliers must be odd to keep every input bit
    return keys


def _round_fn(src: np.ndarray, xor_key: np.uint64, mul_key: np.uint64, shift: np.uint64,
              dst: np.ndarray, tmp: np.ndarray) -> None:
    """``dst ^= ((src ^ xor_key) * mul_key mod 2**64) >> shift``, in place.

    Multiply-shift with an odd key-dependent multiplier is a universal hash family: the kept
    high bits depend on every input bit. ``shift = 64 - width(dst)`` keeps exactly the bits
    the destination half holds, so no mask is needed.
    """
    np.bitwise_xor(src, xor_key, out=tmp)
    np.multiply(tmp, mul_key, out=tmp)
    np.right_shift(tmp, shift, out=tmp)
    np.bitwise_xor(dst, tmp, out=dst)


class Permutation:
    """A keyed bijection on ``[0, n)``: ``p[i]`` is where position ``i`` of the epoch goes.

    Example:
        >>> p = Permutation(10, seed=1, epoch=0)
        >>> sorted(p.take(np.arange(10)).tolist()) == list(range(10))
        True
    """

    __slots__ = ("_bits_hi", "_bits_lo", "_keys", "_mask_lo", "epoch", "n", "salt",
                 "seed")

    def __init__(self, n: int, *, seed: int, epoch: int, salt: str = "") -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ArgumentError(f"Permutation size must be an int >= 1, found {n!r}")
        if not 0 <= seed < 2**63 or not 0 <= epoch < 2**63:
            raise ArgumentError(f"seed and epoch must be in [0, 2**63), found seed {seed!r}, "
                                f"epoch {epoch!r}")
        self.n, self.seed, self.epoch, self.salt = n, seed, epoch, salt
        width = max(1, (n - 1).bit_length())
        if width > 62:
            raise ArgumentError(f"Permutation size {n} exceeds 2**62; split the dataset")
        self._bits_hi = width // 2
        self._bits_lo = width - self._bits_hi
        self._mask_lo = np.uint64((1 << self._bits_lo) - 1)
        self._keys = derive_round_keys(n=n, seed=seed, epoch=epoch, salt=salt)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not -self.n <= i < self.n:
            raise OutOfRangeError(f"index {i} is out of range for a permutation of size "
                                  f"{self.n}; expected -{self.n} <= index < {self.n}")
        return int(self.take(np.array([i % self.n], dtype=np.int64))[0])

    def __repr__(self) -> str:
        return (f"Permutation({self.n}, seed={self.seed}, epoch={self.epoch}, "
                f"salt={self.salt!r})")

    def take(self, idx: np.ndarray) -> np.ndarray:
        """Map positions to their permuted values, vectorized.

        Args:
            idx: Integer array of positions in ``[0, n)`` (any shape).

        Returns:
            An ``int64`` array of the same shape.

        Raises:
            IndexError: when a position is outside ``[0, n)``.
        """
        arr = np.asarray(idx)
        if arr.size and (not np.issubdtype(arr.dtype, np.integer)
                         or arr.min() < 0 or arr.max() >= self.n):
            raise OutOfRangeError(f"positions must be integers in [0, {self.n}), found "
                                  f"dtype {arr.dtype} range [{arr.min()}, {arr.max()}]")
        flat = arr.astype(np.uint64).ravel()
        out = np.empty(flat.shape, dtype=np.int64)
        for lo in range(0, flat.size, _CHUNK):
            out[lo:lo + _CHUNK] = self._walk(flat[lo:lo + _CHUNK])
        return out.reshape(arr.shape)

    def _walk(self, x: np.ndarray) -> np.ndarray:
        """Encrypt, then re-encrypt every value that left ``[0, n)`` until all are in range."""
        y = self._encrypt(x)
        limit = np.uint64(self.n)
        bad = np.flatnonzero(y >= limit)
        while bad.size:
            again = self._encrypt(y[bad])
            y[bad] = again
            bad = bad[again >= limit]
        return y

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        """One pass of the Feistel network on ``w``-bit values (a bijection on ``[0, 2**w)``)."""
        lo = np.bitwise_and(x, self._mask_lo)
        hi = np.right_shift(x, np.uint64(self._bits_lo))
        tmp = np.empty_like(lo)
        shift_hi, shift_lo = np.uint64(64 - self._bits_hi), np.uint64(64 - self._bits_lo)
        xor_keys, mul_keys = self._keys
        for r in range(ROUNDS):
            if r % 2 == 1:
                _round_fn(hi, xor_keys[r], mul_keys[r], shift_lo, lo, tmp)
            elif self._bits_hi:  # a zero-width half (n <= 2) has nothing to update
                _round_fn(lo, xor_keys[r], mul_keys[r], shift_hi, hi, tmp)
        np.left_shift(hi, np.uint64(self._bits_lo), out=hi)
        np.bitwise_or(hi, lo, out=hi)
        return hi
