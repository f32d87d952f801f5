"""Vocabulary look-ups by hash: a chunk's distinct token keys to ids in one probe each.

Preparation maps every chunk's distinct tokens (fixed-width byte keys, see
:func:`~recsys.data.streaming.encoders.token_keys`: the UTF-8 bytes, a terminator byte, NUL
padding) to vocabulary ids. The reference look-up is a binary search over the sorted vocabulary
keys (``np.searchsorted`` on byte strings: ~20 string comparisons per token at 10^6 tokens);
:class:`TokenTable` is an open-addressing hash table built once per vocabulary, probed by a
compiled kernel (:mod:`recsys.jit`), with the same ids to the bit (tested against the binary search).

A key's bytes up to its terminator (its last non-zero byte) are what is hashed and compared, so
keys of different widths (each chunk's dictionary has its own) find each other.
"""

from __future__ import annotations

import numpy as np

from recsys.jit import active, jit

__all__ = ["TokenTable"]

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


@jit
def _length(mat: np.ndarray, i: int) -> int:  # pragma: no cover - compiled
    """Bytes of key ``i`` up to and with its terminator (0 for an all-NUL key)."""
    k = mat.shape[1]
    while k > 0 and mat[i, k - 1] == 0:
        k -= 1
    return k


@jit
def _hash(mat: np.ndarray, i: int, n: int) -> np.uint64:  # pragma: no cover - compiled
    h = _FNV_OFFSET
    for j in range(n):
        h = (h ^ np.uint64(mat[i, j])) * _FNV_PRIME
    return h


@jit
def _build(mat: np.ndarray, slots: np.ndarray) -> None:  # pragma: no cover - compiled
    mask = np.int64(slots.shape[0] - 1)
    for i in range(mat.shape[0]):
        s = np.int64(_hash(mat, i, _length(mat, i)) & np.uint64(mask))
        while slots[s] != 0:
            s = (s + 1) & mask
        slots[s] = i + 1


@jit
def _probe(mat: np.ndarray, slots: np.ndarray, ids: np.ndarray, query: np.ndarray,
           missing: int) -> np.ndarray:  # pragma: no cover - compiled
    mask = np.int64(slots.shape[0] - 1)
    out = np.empty(query.shape[0], dtype=np.int64)
    for q in range(query.shape[0]):
        n = _length(query, q)
        s = np.int64(_hash(query, q, n) & np.uint64(mask))
        out[q] = missing
        while slots[s] != 0:
            i = slots[s] - 1
            if n <= mat.shape[1] and _length(mat, i) == n:
                same = True
                for j in range(n):
                    if mat[i, j] != query[q, j]:
                        same = False
                        break
                if same:
                    out[q] = ids[i]
                    break
            s = (s + 1) & mask
    return out


class TokenTable:
    """Distinct fixed-width byte keys -> ids, by hash.

    Args:
        keys: the vocabulary's distinct keys (``S{w}``, N).
        ids: the id of each key (int64, N).
    """

    def __init__(self, keys: np.ndarray, ids: np.ndarray) -> None:
        n, width = len(keys), max(keys.dtype.itemsize, 1)
        self.keys = np.ascontiguousarray(keys).view(np.uint8).reshape(n, width)
        self.ids = np.ascontiguousarray(ids, dtype=np.int64)
        self.slots = np.zeros(1 << max(4, int(2 * n).bit_length()), dtype=np.int32)  # load factor <= 1/2
        _build(self.keys, self.slots)

    @staticmethod
    def usable() -> bool:
        """Whether the compiled path is on (else the callers search their sorted keys)."""
        return active() == "numba"

    def lookup(self, keys: np.ndarray, missing: int) -> np.ndarray:
        """The id of each of ``keys`` (``S{w}``, any width), ``missing`` where it is not in the table."""
        if not len(keys):
            return np.zeros(0, dtype=np.int64)
        query = np.ascontiguousarray(keys).view(np.uint8).reshape(len(keys), max(keys.dtype.itemsize, 1))
        return _probe(self.keys, self.slots, self.ids, query, missing)
