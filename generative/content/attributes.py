"""``attributes``: multi-hot item attributes -> TF-IDF -> truncated SVD (LSA)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from generative.content.base import ItemContent, sparse_matrix, truncated_svd, unit_rows, with_pad_row
from generative.data import LeaveOneOut, SequenceData

__all__ = ["AttributeContent"]


@dataclass
class AttributeContent(ItemContent):
    """Multi-hot attributes -> TF-IDF -> truncated SVD -> unit rows (LSA over the attribute sets).

    ``tfidf[i, a] = idf(a) / ||·||`` for every attribute ``a`` of item ``i`` (an attribute listed
    twice counts once), ``idf(a) = log((1 + N) / (1 + df(a))) + 1``; the item vector is its row
    projected on the top ``d = min(dim, #attributes, N)`` right singular vectors (``U·S``), then
    L2-normalised. Items without attributes get a zero row (``report["items_without_attributes"]``).

    Args:
        dim: output width (upper bound, see above).
        seed: seed of the randomised SVD.
    """

    name: ClassVar[str] = "attributes"
    dim: int = 64
    seed: int = 0

    def vectors(self, data: SequenceData, split: LeaveOneOut) -> np.ndarray:
        if data.item_attributes is None:
            raise ValueError(f"{data.name}: the dataset has no item attributes; use 'collaborative' or 'text' content")
        n = data.num_items
        owners = np.repeat(np.arange(n), [len(a) for a in data.item_attributes[1:]])
        raw = np.concatenate(data.item_attributes[1:]).astype(np.int64) if owners.size else np.empty(0, np.int64)
        if raw.size == 0:
            raise ValueError(f"{data.name}: no item has any attribute")
        ids, cols = np.unique(raw, return_inverse=True)
        pairs = np.unique(owners * ids.size + cols)  # de-duplicated (item, attribute) cells
        rows, cols = pairs // ids.size, pairs % ids.size
        df = np.bincount(cols, minlength=ids.size)
        idf = np.log((1.0 + n) / (1.0 + df)) + 1.0
        values = idf[cols]
        values /= np.sqrt(np.bincount(rows, weights=values**2, minlength=n))[rows]
        tfidf = sparse_matrix(rows, cols, values, (n, ids.size))
        u, s, _ = truncated_svd(tfidf, self.dim, seed=self.seed)
        out = unit_rows((u * s).numpy())
        self._report = {
            "items_without_attributes": int(n - np.unique(rows).size),
            "num_attributes": int(ids.size),
            "dim": int(out.shape[1]),
            "explained_variance": float((s**2).sum() / (values**2).sum()),
        }
        return with_pad_row(out)
