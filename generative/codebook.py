"""Semantic IDs: item vectors in, a table of per-level codes out (docs/methods.md §5.1, §5.6).

A :class:`CodebookBuilder` quantises item content vectors ``[num_items + 1, d]`` (row 0, the
padding item, is ignored) into ``levels`` residual codes per item, then (TIGER) appends one more
level that tells apart the items whose codes collide. The result is a :class:`Codebook`::

    builder = CodebookBuilder.create("rq-kmeans", levels=3, codebook_size=256)
    codebook = builder.fit(vectors, seed=0)      # codes [num_items + 1, 4], row 0 = -1
    codebook.tokens_of(17)                       # (12, 201, 5, 0)
    codebook.item_of((12, 201, 5, 0))            # 17
    codebook.save("sid.json"); Codebook.load("sid.json")

Builders (registered names):

* ``"rq-kmeans"`` (:class:`RQKMeans`, the default): level 1 is k-means on the item vectors,
  level ``l`` is k-means on the residual ``x - Σ_{j<l} c_j``. Deterministic for a seed.
* ``"rq-vae"`` (:class:`RQVAE`): an MLP autoencoder with a residual vector quantiser between
  encoder and decoder, codebooks initialised by residual k-means on the untrained encoder's
  latents (§5.1), trained with MSE reconstruction + codebook + β·commitment, straight-through.
  Code usage and perplexity per level are tracked every epoch so codebook collapse is visible.

Collisions (several items with the same code tuple) are resolved as in TIGER: with
``disambiguate=True`` (default) a last level holds each item's index within its collision
group (0 for unique items, in item-index order), and ``level_sizes[-1]`` is the largest group
size (at least 1). With ``disambiguate=False`` the colliding codes are kept: the codebook is
returned (its :attr:`Codebook.stats` report the collisions and :attr:`Codebook.is_unique` is
False), but the tuple -> item lookups (:meth:`Codebook.item_of`, :meth:`Codebook.items_of`)
refuse with a :class:`CodebookError`, since a colliding tuple has no single item.

Capacity rule (checked before fitting): the catalogue must fit
``Π_l codebook_size_l × slots`` distinct IDs, where ``slots`` is ``max_group_size`` with
disambiguation (default: the largest level size, so the collision token's vocabulary is no
larger than a level's) and 1 without. The error names the smallest ``codebook_size`` (same size
at every level) that would fit. Because k-means does not spread items evenly, a codebook that
passes this check can still produce a collision group larger than ``max_group_size``; the fit
then fails with the size of that group.
"""

from __future__ import annotations

import copy
import io
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from recsys.io import atomic_write_text
from recsys.registry import Registered

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from recsys.tracking import RunTracker

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "RQVAE",
    "Codebook",
    "CodebookBuilder",
    "CodebookError",
    "RQKMeans",
    "builder_names",
    "code_perplexity",
    "collision_groups",
    "kmeans",
    "min_codebook_size",
    "residual_kmeans",
]

#: ``"format"`` field of a saved codebook
FORMAT = "salience-codebook"
#: version of the file format written by :meth:`Codebook.save`
FORMAT_VERSION = 1
#: rows per chunk of a distance computation (bounds the ``[chunk, K]`` distance matrix)
_CHUNK = 32768


class CodebookError(ValueError):
    """A codebook is malformed, does not fit its catalogue, or cannot map tuples to items."""


# -- statistics --------------------------------------------------------------------------------


def collision_groups(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Groups of items that share a code tuple.

    Args:
        raw: ``[N, L]`` codes of items ``1..N`` (row ``i`` is item ``i + 1``).

    Returns:
        ``group`` ``[N]`` (group id per item), ``sizes`` ``[G]`` (items per group) and ``rank``
        ``[N]``: the item's index within its group, in item order (0 for the first / only one).
    """
    _, group, sizes = np.unique(raw, axis=0, return_inverse=True, return_counts=True)
    group = group.reshape(-1)
    order = np.argsort(group, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty(len(group), dtype=np.int64)
    rank[order] = np.arange(len(group)) - starts[group[order]]
    return group.astype(np.int64), sizes.astype(np.int64), rank


def code_perplexity(codes: np.ndarray, size: int) -> tuple[float, float]:
    """Usage (fraction of the ``size`` codes used) and perplexity ``exp(H)`` of the code
    distribution of one level, ``codes`` ``[N]`` (each item counts once)."""
    counts = np.bincount(np.asarray(codes, dtype=np.int64), minlength=size).astype(np.float64)
    total = counts.sum()
    if total == 0:
        return 0.0, 0.0
    p = counts[counts > 0] / total
    return float((counts > 0).sum() / size), float(np.exp(-(p * np.log(p)).sum()))


def _collision_stats(raw: np.ndarray) -> dict[str, Any]:
    """Collision statistics of the pre-disambiguation codes ``raw`` ``[N, L]``."""
    _, sizes, _ = collision_groups(raw)
    shared = sizes[sizes > 1]
    n = len(raw)
    return {
        "collision_rate_before": float(shared.sum() / n),
        "num_collision_groups": int(len(shared)),
        "max_group_size": int(sizes.max()),
        "distinct_ids_before": int(len(sizes)),
        "distinct_prefixes": [int(len(np.unique(raw[:, : d + 1], axis=0))) for d in range(raw.shape[1])],
    }


def min_codebook_size(num_items: int, levels: int, slots: int = 1) -> int:
    """Smallest ``s`` with ``s**levels * slots >= num_items`` (exact integer arithmetic)."""
    need = -(-num_items // max(slots, 1))
    s = max(1, int(round(need ** (1.0 / levels))))
    while s**levels < need:
        s += 1
    while s > 1 and (s - 1) ** levels >= need:
        s -= 1
    return s


def _plain(value: Any) -> Any:
    """Numpy/torch scalars and arrays, tuples -> JSON-ready Python values (lists, floats, ints)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, Tensor):
        return _plain(value.detach().cpu().tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    return value


# -- the codebook ------------------------------------------------------------------------------


class Codebook:
    """The item <-> semantic-ID table.

    Args:
        codes: int64 ``[num_items + 1, L]``; row ``i`` is item ``i``'s code per level, row 0 is
            ``-1``; level ``l`` codes lie in ``[0, level_sizes[l])``.
        level_sizes: codes per level (the last one is the collision level when
            ``disambiguated``).
        method: the builder's name (``"rq-kmeans"``, ``"rq-vae"``, ``"manual"``).
        disambiguated: the last level is the TIGER collision token.
        stats: statistics of the build (see :meth:`CodebookBuilder.fit`); JSON-ready values.
        config: the builder's settings.

    Raises:
        CodebookError: empty catalogue, wrong shape/dtype, row 0 not ``-1``, codes out of range.
    """

    def __init__(
        self,
        codes: np.ndarray,
        level_sizes: Sequence[int],
        method: str = "manual",
        disambiguated: bool = False,
        stats: Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[1] < 1:
            raise CodebookError(f"codes must be a [num_items + 1, L] array, got shape {codes.shape}")
        if codes.shape[0] < 2:
            raise CodebookError("empty catalogue: codes has no item rows (row 0 is the padding item)")
        if not np.issubdtype(codes.dtype, np.integer):
            raise CodebookError(f"codes must be integers, got dtype {codes.dtype}")
        sizes = [int(s) for s in level_sizes]
        if len(sizes) != codes.shape[1]:
            raise CodebookError(f"level_sizes has {len(sizes)} entries but codes has {codes.shape[1]} levels")
        if min(sizes) < 1:
            raise CodebookError(f"level_sizes must be >= 1, got {sizes}")
        if not (codes[0] == -1).all():
            raise CodebookError(f"row 0 (padding item) must be -1, got {codes[0].tolist()}")
        body = codes[1:]
        for lvl, size in enumerate(sizes):
            bad = np.flatnonzero((body[:, lvl] < 0) | (body[:, lvl] >= size))
            if len(bad):
                item = int(bad[0]) + 1
                raise CodebookError(
                    f"item {item}: level {lvl} code {int(body[bad[0], lvl])} is outside [0, {size}) "
                    f"({len(bad)} items out of range at that level)"
                )
        self.codes: np.ndarray = codes.astype(np.int64, copy=True)
        self.codes.setflags(write=False)
        self.level_sizes: list[int] = sizes
        self.method = str(method)
        self.disambiguated = bool(disambiguated)
        self.stats: dict[str, Any] = _plain(dict(stats or {}))
        self.config: dict[str, Any] = _plain(dict(config or {}))
        self._keys: np.ndarray | None = None  # sorted mixed-radix keys of rows 1..N
        self._key_items: np.ndarray | None = None
        self._radix: np.ndarray | None = None
        self._table: dict[tuple[int, ...], int] | None = None  # fallback when keys overflow int64
        self._num_groups = int(len(np.unique(body, axis=0)))

    # -- shape ---------------------------------------------------------------------------------
    @property
    def num_items(self) -> int:
        return int(self.codes.shape[0] - 1)

    @property
    def num_levels(self) -> int:
        return int(self.codes.shape[1])

    @property
    def is_unique(self) -> bool:
        """Every item has its own code tuple (always true after disambiguation)."""
        return self._num_groups == self.num_items

    def __repr__(self) -> str:
        return f"Codebook(method={self.method!r}, num_items={self.num_items}, level_sizes={self.level_sizes})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Codebook):
            return NotImplemented
        return (
            np.array_equal(self.codes, other.codes)
            and self.level_sizes == other.level_sizes
            and self.method == other.method
            and self.disambiguated == other.disambiguated
            and self.stats == other.stats
            and self.config == other.config
        )

    __hash__ = None  # type: ignore[assignment]

    # -- lookups -------------------------------------------------------------------------------
    def tokens_of(self, item: int) -> tuple[int, ...]:
        """Item ``item`` (``1..num_items``) -> its code tuple (length :attr:`num_levels`)."""
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)) or not 1 <= int(item) <= self.num_items:
            raise CodebookError(f"item must be an index in 1..{self.num_items}, got {item!r}")
        return tuple(int(c) for c in self.codes[int(item)])

    def _check_unique(self) -> None:
        if not self.is_unique:
            n = self.num_items - self._num_groups
            raise CodebookError(
                f"codebook ({self.method}) maps several items to one code tuple ({n} items beyond the first "
                f"of their collision group); rebuild with disambiguate=True to look items up by tuple"
            )

    def _build_lookup(self) -> None:
        self._check_unique()
        if self._keys is not None or self._table is not None:
            return
        if math.prod(self.level_sizes) < 2**62:
            radix = np.ones(self.num_levels, dtype=np.int64)
            for lvl in range(self.num_levels - 2, -1, -1):
                radix[lvl] = radix[lvl + 1] * self.level_sizes[lvl + 1]
            keys = self.codes[1:] @ radix
            order = np.argsort(keys, kind="stable")
            self._radix, self._keys, self._key_items = radix, keys[order], order.astype(np.int64) + 1
        else:
            self._table = {tuple(int(c) for c in row): i + 1 for i, row in enumerate(self.codes[1:])}

    def item_of(self, tokens: Sequence[int]) -> int:
        """Code tuple -> item index, or 0 when it is not a catalogue item's tuple.

        Raises:
            CodebookError: the codebook has colliding tuples (built with ``disambiguate=False``).
        """
        row = np.asarray(list(tokens), dtype=np.int64).reshape(1, -1)
        return int(self.items_of(row)[0])

    def items_of(self, codes: np.ndarray | Tensor) -> np.ndarray:
        """Vectorised :meth:`item_of`: codes ``[n, L]`` -> int64 items ``[n]`` (0 for tuples
        that are no catalogue item's, including out-of-range or negative codes).

        Raises:
            CodebookError: colliding codebook, or ``codes`` not ``[n, num_levels]``.
        """
        if isinstance(codes, Tensor):
            codes = codes.detach().cpu().numpy()
        arr = np.asarray(codes)
        if arr.ndim != 2 or arr.shape[1] != self.num_levels:
            raise CodebookError(f"codes must be [n, {self.num_levels}], got shape {arr.shape}")
        arr = arr.astype(np.int64, copy=False)
        self._build_lookup()
        out = np.zeros(len(arr), dtype=np.int64)
        if len(arr) == 0:
            return out
        valid = ((arr >= 0) & (arr < np.asarray(self.level_sizes, dtype=np.int64))).all(axis=1)
        if self._table is not None:
            for i in np.flatnonzero(valid):
                out[i] = self._table.get(tuple(int(c) for c in arr[i]), 0)
            return out
        assert self._keys is not None and self._key_items is not None and self._radix is not None
        keys = arr[valid] @ self._radix
        pos = np.clip(np.searchsorted(self._keys, keys), 0, len(self._keys) - 1)
        hit = self._keys[pos] == keys
        out[np.flatnonzero(valid)] = np.where(hit, self._key_items[pos], 0)
        return out

    # -- reports -------------------------------------------------------------------------------
    def level_usage(self) -> list[dict[str, float]]:
        """Per level: ``usage`` (fraction of codes used) and ``perplexity`` of the final codes."""
        out = []
        for lvl, size in enumerate(self.level_sizes):
            usage, ppl = code_perplexity(self.codes[1:, lvl], size)
            out.append({"usage": usage, "perplexity": ppl})
        return out

    def summary(self) -> str:
        """A few lines: method, sizes, collisions, per-level usage and perplexity, losses."""
        s = self.stats
        lines = [
            f"codebook {self.method}: {self.num_items} items, {self.num_levels} levels {self.level_sizes}"
            + (" (last = collision token)" if self.disambiguated else ""),
        ]
        if "collision_rate_before" in s:
            lines.append(
                f"collisions before disambiguation: {s['collision_rate_before']:.4f} of items in "
                f"{s.get('num_collision_groups', 0)} groups, largest group {s.get('max_group_size', 1)}"
            )
        lines.append(f"unique IDs: {'yes' if self.is_unique else 'NO (item_of refuses)'}")
        lines.append("level  size  used   usage   perplexity")
        for lvl, (size, u) in enumerate(zip(self.level_sizes, self.level_usage())):
            used = int(round(u["usage"] * size))
            lines.append(f"{lvl:>5}  {size:>4}  {used:>4}  {u['usage']:6.3f}  {u['perplexity']:10.2f}")
        for key in ("quantization_mse", "reconstruction_loss_initial", "reconstruction_loss"):
            if key in s:
                value = s[key]
                text = ", ".join(f"{v:.4g}" for v in value) if isinstance(value, list) else f"{value:.4g}"
                lines.append(f"{key}: {text}")
        return "\n".join(lines)

    def codes_csv(self, item_labels: Sequence[str] | None = None) -> str:
        """The table as CSV: ``item[,label],level_0,...`` for items ``1..num_items``."""
        buf = io.StringIO()
        levels = [f"level_{i}" for i in range(self.num_levels)]
        head = ["item"] + (["label"] if item_labels is not None else []) + levels
        buf.write(",".join(head) + "\n")
        for i in range(1, self.num_items + 1):
            cells = [str(i)]
            if item_labels is not None:
                label = str(item_labels[i])
                cells.append('"' + label.replace('"', '""') + '"' if any(c in label for c in ',"\n') else label)
            cells.extend(str(int(c)) for c in self.codes[i])
            buf.write(",".join(cells) + "\n")
        return buf.getvalue()

    def plot(self) -> Figure:
        """Rank-frequency bars of code usage per level (items per code, most used first); a
        second row with loss, usage and perplexity over epochs when training curves exist."""
        from matplotlib.figure import Figure

        curves = self.stats.get("training")
        rows = 2 if curves else 1
        cols = max(self.num_levels, 3 if curves else 1)
        fig = Figure(figsize=(3.0 * cols, 2.8 * rows))
        usage = self.level_usage()
        for lvl, size in enumerate(self.level_sizes):
            ax = fig.add_subplot(rows, cols, lvl + 1)
            counts = np.sort(np.bincount(self.codes[1:, lvl], minlength=size))[::-1]
            ax.bar(np.arange(size), counts, width=1.0, color="tab:blue")
            name = "collision" if self.disambiguated and lvl == self.num_levels - 1 else f"level {lvl}"
            ax.set(
                title=f"{name}: {usage[lvl]['usage']:.0%} used, ppl {usage[lvl]['perplexity']:.1f}",
                xlabel="code (by rank)",
                ylabel="items",
            )
            ax.title.set_fontsize(9)
        if curves:
            epochs = curves["epoch"]
            ax = fig.add_subplot(rows, cols, cols + 1)
            ax.plot(epochs, curves["reconstruction_loss"], label="reconstruction")
            ax.plot(epochs, curves["loss"], label="total")
            ax.set(xlabel="epoch", ylabel="loss", yscale="log", title="RQ-VAE loss")
            ax.legend(fontsize=7)
            for j, key in enumerate(("usage", "perplexity")):
                ax = fig.add_subplot(rows, cols, cols + 2 + j)
                values = np.asarray(curves[key], dtype=float)  # [epochs, levels]
                for lvl in range(values.shape[1]):
                    ax.plot(epochs, values[:, lvl], label=f"level {lvl}")
                ax.set(xlabel="epoch", ylabel=key, title=f"code {key} per epoch")
                ax.legend(fontsize=7)
        fig.tight_layout()
        return fig

    def scalar_metrics(self, prefix: str = "sid.") -> dict[str, float]:
        """Flat scalar statistics for MLflow: collisions, usage/perplexity per level, losses."""
        out: dict[str, float] = {}
        for key in ("collision_rate_before", "num_collision_groups", "max_group_size",
                    "reconstruction_loss_initial", "reconstruction_loss"):  # fmt: skip
            if key in self.stats:
                out[f"{prefix}{key}"] = float(self.stats[key])
        for lvl, u in enumerate(self.level_usage()):
            out[f"{prefix}usage.level_{lvl}"] = u["usage"]
            out[f"{prefix}perplexity.level_{lvl}"] = u["perplexity"]
        for lvl, mse in enumerate(self.stats.get("quantization_mse", [])):
            out[f"{prefix}quantization_mse.level_{lvl}"] = float(mse)
        return out

    def to_mlflow(
        self, tracker: RunTracker, prefix: str = "sid", item_labels: Sequence[str] | None = None
    ) -> None:
        """Log the codebook to ``tracker``'s run.

        Artifacts under ``prefix/``: ``codebook.json`` (the :meth:`save` file, loadable with
        :meth:`load`), ``codes.csv`` (the table), ``stats.json``, ``summary.txt`` and
        ``usage.png`` (:meth:`plot`). Metrics: :meth:`scalar_metrics` (``sid.*``), and for an
        RQ-VAE the per-epoch curves as stepped metrics ``sid.train.*``.
        """
        tracker.log_dict(self.to_dict(), f"{prefix}/codebook.json")
        tracker.log_text(self.codes_csv(item_labels), f"{prefix}/codes.csv")
        stats = {"level_sizes": self.level_sizes, "usage_by_level": self.level_usage(), **self.stats}
        tracker.log_dict(stats, f"{prefix}/stats.json")
        tracker.log_text(self.summary() + "\n", f"{prefix}/summary.txt")
        tracker.log_figure(self.plot(), f"{prefix}/usage.png")
        tracker.log_metrics(self.scalar_metrics(f"{prefix}."))
        curves = self.stats.get("training")
        if curves:
            for e, epoch in enumerate(curves["epoch"]):
                step: dict[str, float] = {
                    f"{prefix}.train.loss": curves["loss"][e],
                    f"{prefix}.train.reconstruction_loss": curves["reconstruction_loss"][e],
                    f"{prefix}.train.collision_rate": curves["collision_rate"][e],
                }
                for lvl in range(len(curves["usage"][e])):
                    step[f"{prefix}.train.usage.level_{lvl}"] = curves["usage"][e][lvl]
                    step[f"{prefix}.train.perplexity.level_{lvl}"] = curves["perplexity"][e][lvl]
                tracker.log_metrics(step, step=int(epoch))

    # -- files ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready contents; ``codes`` lists rows ``1..num_items`` (row 0 is implied)."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "method": self.method,
            "num_items": self.num_items,
            "level_sizes": list(self.level_sizes),
            "disambiguated": self.disambiguated,
            "config": self.config,
            "stats": self.stats,
            "codes": self.codes[1:].tolist(),
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "codebook") -> Codebook:
        """Inverse of :meth:`to_dict`; errors name ``source``."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise CodebookError(f"{source}: not a codebook file (expected \"format\": {FORMAT!r})")
        version = data.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
            raise CodebookError(
                f"{source}: codebook format version {version!r} is not one this Salience reads (1..{FORMAT_VERSION})"
            )
        missing = sorted({"num_items", "level_sizes", "codes"} - set(data))
        if missing:
            raise CodebookError(f"{source}: missing keys {missing}")
        sizes, rows, num_items = data["level_sizes"], data["codes"], data["num_items"]
        if not isinstance(sizes, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes):
            raise CodebookError(f"{source}: level_sizes must be a list of integers, got {sizes!r}")
        if not isinstance(num_items, int) or not isinstance(rows, list):
            raise CodebookError(f"{source}: num_items must be an integer and codes a list of rows")
        if len(rows) != num_items:
            raise CodebookError(f"{source}: num_items is {num_items} but the file has {len(rows)} code rows")
        for i, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != len(sizes) or not all(
                isinstance(c, int) and not isinstance(c, bool) for c in row
            ):
                raise CodebookError(f"{source}: code row of item {i + 1} is {row!r}; expected {len(sizes)} integers")
        codes = np.full((num_items + 1, len(sizes)), -1, dtype=np.int64)
        if num_items:
            codes[1:] = np.asarray(rows, dtype=np.int64)
        try:
            book = cls(
                codes,
                sizes,
                method=str(data.get("method", "manual")),
                disambiguated=bool(data.get("disambiguated", False)),
                stats=data.get("stats") or {},
                config=data.get("config") or {},
            )
        except CodebookError as e:
            raise CodebookError(f"{source}: {e}") from e
        if book.disambiguated and not book.is_unique:
            shared = num_items - book._num_groups
            raise CodebookError(f"{source}: marked disambiguated but {shared} items share a code tuple")
        return book

    def save(self, path: str | Path) -> Path:
        """Write the codebook as JSON (atomically), one code row per line; returns the path."""
        path = Path(path)
        data = self.to_dict()
        rows = data.pop("codes")
        head = json.dumps(data, indent=1, allow_nan=False)
        body = ",\n".join("  " + json.dumps(r) for r in rows)
        head = head[: head.rstrip().rfind("}")].rstrip()  # reopen the object to append the codes
        text = head + ',\n "codes": [\n' + body + ("\n" if rows else "") + " ]\n}\n"
        atomic_write_text(path, text)
        return path

    @classmethod
    def load(cls, path: str | Path, num_items: int | None = None) -> Codebook:
        """Read a :meth:`save` file; ``num_items`` checks it against the catalogue it is used with.

        Raises:
            FileNotFoundError: no such file.
            CodebookError: not a codebook, corrupt, or a different catalogue size (the message
                names the file).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"codebook not found: {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise CodebookError(f"{path}: not a codebook file (not UTF-8 text)") from e
        except json.JSONDecodeError as e:
            raise CodebookError(f"{path}: not a codebook file (invalid JSON at line {e.lineno}: {e.msg})") from e
        book = cls.from_dict(data, source=str(path))
        if num_items is not None and book.num_items != num_items:
            raise CodebookError(f"{path}: codebook covers {book.num_items} items but the catalogue has {num_items}")
        return book


# -- k-means -----------------------------------------------------------------------------------


def _nearest(x: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """Nearest centroid: ``x`` ``[N, d]``, ``c`` ``[K, d]`` -> index ``[N]`` and squared
    distance ``[N]`` (ties -> lowest index), computed in row chunks."""
    c_sq = (c * c).sum(1)
    idx, dist = [], []
    for i in range(0, len(x), _CHUNK):
        xb = x[i : i + _CHUNK]
        d = (xb * xb).sum(1, keepdim=True) - 2.0 * xb @ c.T + c_sq
        m, j = d.min(1)
        idx.append(j)
        dist.append(m.clamp_min(0.0))
    return torch.cat(idx), torch.cat(dist)


def _kmeans_pp(x: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """k-means++ seeding: first centre uniform, then each new centre drawn ∝ D² (``[k, d]``)."""
    n = len(x)
    first = int(torch.randint(n, (1,), generator=gen, device=gen.device).item())
    centres = [x[first]]
    d2 = ((x - x[first]) ** 2).sum(1)
    for _ in range(1, k):
        total = d2.sum()
        if not bool(total > 0):
            break
        j = int(torch.multinomial((d2 / total).double().cpu(), 1, generator=gen).item())
        centres.append(x[j])
        d2 = torch.minimum(d2, ((x - x[j]) ** 2).sum(1))
    return torch.stack(centres)


def kmeans(
    x: Tensor, k: int, generator: torch.Generator, iterations: int = 50, tol: float = 1e-6, n_init: int = 1
) -> tuple[Tensor, Tensor, float, int]:
    """Lloyd's k-means with k-means++ seeding, deterministic for a generator state.

    ``k`` is capped at the number of distinct rows of ``x`` (the rest of a level's vocabulary
    then stays unused). A cluster that empties is reseeded with the point farthest from its
    centroid. Stops when no assignment changes or the inertia improves by less than ``tol``
    (relative). With ``n_init > 1`` the run with the lowest inertia is kept.

    Args:
        x: ``[N, d]`` float points, ``N >= 1``.
        k: clusters wanted.
        generator: the random source (a CPU ``torch.Generator``).

    Returns:
        ``centroids`` ``[k_eff, d]``, ``assign`` ``[N]`` int64, inertia (mean squared distance
        to the assigned centroid) and the Lloyd iterations of the kept run.
    """
    if len(x) == 0:
        raise ValueError("kmeans: no points")
    k_eff = min(int(k), int(len(torch.unique(x, dim=0))))
    best: tuple[Tensor, Tensor, float, int] | None = None
    for _ in range(max(1, n_init)):
        c = _kmeans_pp(x, k_eff, generator)
        assign, dist = _nearest(x, c)
        inertia = float(dist.mean())
        it = 0
        for it in range(1, iterations + 1):
            counts = torch.bincount(assign, minlength=len(c))
            empty = torch.nonzero(counts == 0).flatten()
            if len(empty):
                far = torch.argsort(dist, descending=True, stable=True)
                taken = 0
                for j in empty.tolist():
                    while taken < len(far) and counts[assign[far[taken]]] <= 1:
                        taken += 1  # keep singleton clusters; take points from larger ones
                    if taken == len(far):
                        break
                    p = far[taken]
                    counts[assign[p]] -= 1
                    counts[j] = 1
                    assign[p] = j
                    taken += 1
            sums = torch.zeros_like(c).index_add_(0, assign, x)
            counts = torch.bincount(assign, minlength=len(c)).to(x.dtype)
            filled = counts > 0
            c = torch.where(filled[:, None], sums / counts.clamp_min(1.0)[:, None], c)
            new_assign, dist = _nearest(x, c)
            new_inertia = float(dist.mean())
            changed = bool((new_assign != assign).any())
            assign = new_assign
            done = not changed or (inertia - new_inertia) <= tol * max(inertia, 1e-30)
            inertia = new_inertia
            if done:
                break
        if best is None or inertia < best[2]:
            best = (c, assign, inertia, it)
    assert best is not None
    return best


def residual_kmeans(
    x: Tensor, sizes: Sequence[int], generator: torch.Generator, iterations: int = 50, n_init: int = 1
) -> tuple[np.ndarray, list[Tensor], list[float], list[int]]:
    """Residual k-means: level ``l`` clusters ``x - Σ_{j<l} c_j`` into ``sizes[l]`` codes.

    Returns:
        codes ``[N, L]`` int64, the centroids per level (``[K_l, d]``, padded to ``sizes[l]``
        rows by repeating the last centroid when ``k`` was capped), the mean squared residual
        after each level, and the Lloyd iterations per level.
    """
    residual = x.clone()
    codes, books, mse, iters = [], [], [], []
    for size in sizes:
        c, assign, _, it = kmeans(residual, size, generator, iterations=iterations, n_init=n_init)
        residual = residual - c[assign]
        if len(c) < size:
            c = torch.cat([c, c[-1:].expand(size - len(c), -1)])
        codes.append(assign)
        books.append(c)
        mse.append(float((residual * residual).sum(1).mean()))
        iters.append(it)
    return torch.stack(codes, 1).cpu().numpy().astype(np.int64), books, mse, iters


# -- builders ----------------------------------------------------------------------------------


@dataclass
class CodebookBuilder(Registered, ABC):
    """Item vectors -> :class:`Codebook` (see the module docstring for the collision and
    capacity rules).

    Args:
        levels: quantisation levels before the collision token (TIGER: 3).
        codebook_size: codes per level, one int for all levels or one per level (TIGER: 256).
        disambiguate: append the TIGER collision level.
        max_group_size: most items one code tuple may hold when disambiguating (the collision
            token's vocabulary); default: the largest level size.
        device: torch device of the fit.
    """

    kind: ClassVar[str] = "codebook builder"
    _registry: ClassVar[dict[str, type[Registered]]] = {}

    levels: int = 3
    codebook_size: int | list[int] = 256
    disambiguate: bool = True
    max_group_size: int | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        if isinstance(self.levels, bool) or not isinstance(self.levels, int) or self.levels < 1:
            raise ValueError(f"levels must be an integer >= 1, got {self.levels!r}")
        sizes = self.level_sizes()
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"codebook_size must be integers >= 1, got {self.codebook_size!r}")
        if self.max_group_size is not None and self.max_group_size < 1:
            raise ValueError(f"max_group_size must be >= 1, got {self.max_group_size}")

    def level_sizes(self) -> list[int]:
        """Codes per quantisation level (without the collision level)."""
        if isinstance(self.codebook_size, (list, tuple)):
            if len(self.codebook_size) != self.levels:
                raise ValueError(f"codebook_size lists {len(self.codebook_size)} sizes for {self.levels} levels")
            return list(self.codebook_size)
        return [self.codebook_size] * self.levels

    def slots(self) -> int:
        """Items one code tuple may hold: ``max_group_size`` (default: the largest level size)
        with disambiguation, else 1."""
        if not self.disambiguate:
            return 1
        return int(self.max_group_size or max(self.level_sizes()))

    def check_capacity(self, num_items: int) -> None:
        """Refuse a catalogue larger than ``Π sizes × slots`` (see the module docstring).

        Raises:
            ValueError: with the smallest ``codebook_size`` that fits.
        """
        if num_items < 1:
            raise ValueError("empty catalogue: there are no items to encode (vectors has only the padding row 0)")
        sizes, slots = self.level_sizes(), self.slots()
        capacity = math.prod(sizes) * slots
        if num_items > capacity:
            need = min_codebook_size(num_items, self.levels, slots)
            what = f"{' x '.join(map(str, sizes))} codes"
            what += f" x {slots} collision slots" if self.disambiguate else ""
            raise ValueError(
                f"codebook too small for the catalogue: {what} hold {capacity} distinct IDs but there are "
                f"{num_items} items; the minimum codebook_size for {self.levels} levels is {need}"
                + (f" (with max_group_size={slots})" if self.disambiguate else " (disambiguate=False)")
                + ", or add levels"
            )

    def fit(self, vectors: np.ndarray, seed: int = 0) -> Codebook:
        """Build the codebook of items ``1..N``.

        Args:
            vectors: float ``[N + 1, d]`` item vectors; row 0 (padding) is ignored.
            seed: the fit is a deterministic function of ``(vectors, settings, seed)``.

        Returns:
            a :class:`Codebook` whose ``stats`` hold ``collision_rate_before`` (fraction of
            items whose tuple before disambiguation is shared with another item),
            ``num_collision_groups``, ``max_group_size``, ``distinct_prefixes`` (per depth),
            ``usage`` and ``perplexity`` per level of the final codes, plus the builder's own
            entries (``quantization_mse``; RQ-VAE losses and per-epoch ``training`` curves).

        Raises:
            ValueError: empty catalogue, non-finite vectors, codebook too small, or a collision
                group larger than ``max_group_size``.
        """
        x = self._check_vectors(vectors)
        self.check_capacity(len(x))
        raw, extra = self._quantize(x, self.level_sizes(), int(seed))
        return self._assemble(raw, extra, x.shape[1], int(seed))

    @abstractmethod
    def _quantize(self, x: Tensor, sizes: list[int], seed: int) -> tuple[np.ndarray, dict[str, Any]]:
        """Codes ``[N, levels]`` of the item vectors ``x`` ``[N, d]`` and builder statistics."""

    # -- shared steps ----------------------------------------------------------------------------
    @staticmethod
    def _check_vectors(vectors: np.ndarray) -> Tensor:
        arr = np.asarray(vectors)
        if arr.ndim != 2:
            raise ValueError(f"vectors must be a [num_items + 1, d] array, got shape {arr.shape}")
        if arr.shape[0] < 2:
            raise ValueError("empty catalogue: vectors has no item rows (row 0 is the padding item)")
        if arr.shape[1] < 1:
            raise ValueError("vectors has dimension 0")
        if not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"vectors must be numeric, got dtype {arr.dtype}")
        body = arr[1:].astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(body).all(axis=1))
        if len(bad):
            raise ValueError(f"vectors of item {int(bad[0]) + 1} are not finite ({len(bad)} items with NaN/inf)")
        return torch.from_numpy(np.ascontiguousarray(body))

    def _assemble(self, raw: np.ndarray, extra: dict[str, Any], dim: int, seed: int) -> Codebook:
        sizes = self.level_sizes()
        stats = _collision_stats(raw)
        _, _, rank = collision_groups(raw)
        if self.disambiguate:
            if stats["max_group_size"] > self.slots():
                raise ValueError(
                    f"the largest collision group holds {stats['max_group_size']} items, more than "
                    f"max_group_size={self.slots()}; use a larger codebook_size or more levels, "
                    "or raise max_group_size"
                )
            raw = np.concatenate([raw, rank[:, None]], axis=1)
            sizes = sizes + [int(stats["max_group_size"])]
        codes = np.concatenate([np.full((1, raw.shape[1]), -1, dtype=np.int64), raw.astype(np.int64)])
        per_level = [code_perplexity(codes[1:, lvl], s) for lvl, s in enumerate(sizes)]
        stats["usage"] = [u for u, _ in per_level]
        stats["perplexity"] = [p for _, p in per_level]
        stats.update(extra)
        config = {"name": self.name, **self.describe(), "seed": seed, "input_dim": dim}
        return Codebook(codes, sizes, method=self.name, disambiguated=self.disambiguate, stats=stats, config=config)

    def _generator(self, seed: int) -> torch.Generator:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed)
        return gen


@dataclass
class RQKMeans(CodebookBuilder):
    """Residual k-means semantic IDs (§5.6): k-means++ seeding, Lloyd iterations, empty
    clusters reseeded with the farthest points; ``k`` capped at the distinct residuals.

    Args:
        iterations: at most this many Lloyd iterations per level.
        n_init: k-means restarts per level (the lowest inertia is kept).
    """

    name: ClassVar[str] = "rq-kmeans"

    iterations: int = 50
    n_init: int = 1

    def _quantize(self, x: Tensor, sizes: list[int], seed: int) -> tuple[np.ndarray, dict[str, Any]]:
        gen = self._generator(seed)
        raw, _, mse, iters = residual_kmeans(
            x.to(self.device), sizes, gen, iterations=self.iterations, n_init=self.n_init
        )
        total = float(((x - x.mean(0)) ** 2).sum(1).mean())
        return raw, {"quantization_mse": mse, "input_variance": total, "kmeans_iterations": iters}


def _mlp(dims: Sequence[int]) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class _ResidualVQ(nn.Module):
    """Residual vector quantiser: one codebook ``[K_l, D]`` per level, nearest-code assignment."""

    def __init__(self, sizes: Sequence[int], dim: int) -> None:
        super().__init__()
        self.books = nn.ParameterList([nn.Parameter(torch.zeros(s, dim)) for s in sizes])

    def forward(self, z: Tensor, beta: float) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
        """``z`` ``[B, D]`` -> straight-through quantised ``[B, D]``, codes ``[B, L]``, the VQ loss
        (mean over levels of codebook + β·commitment) and the residual entering each level."""
        residual = z
        quantised = torch.zeros_like(z)
        codes, residuals = [], []
        loss = z.new_zeros(())
        for book in self.books:
            residuals.append(residual.detach())
            idx, _ = _nearest(residual.detach(), book.detach())
            q = book[idx]
            loss = loss + ((q - residual.detach()) ** 2).mean() + beta * ((residual - q.detach()) ** 2).mean()
            quantised = quantised + q
            residual = residual - q.detach()
            codes.append(idx)
        st = z + (quantised - z).detach()
        return st, torch.stack(codes, 1), loss / len(self.books), residuals


@dataclass
class RQVAE(CodebookBuilder):
    """RQ-VAE semantic IDs (§5.1, §5.6): MLP encoder ``d -> hidden -> latent``, residual VQ with
    ``levels × codebook_size`` codes, mirrored decoder.

    Codebooks are initialised by residual k-means on the untrained encoder's latents of all
    items. Loss = MSE reconstruction + mean over levels of ``‖sg(r_l) − q_l‖² + β‖r_l − sg(q_l)‖²``
    with the straight-through estimator; AdamW. Training assigns the nearest code (the
    reference's Sinkhorn-balanced assignment is not reproduced). Every epoch records the loss,
    code usage and perplexity per level (over the epoch's assignments) and the collision rate
    (nearest codes of all items); ``stats["training"]`` keeps the curves so collapse is visible.

    Args:
        hidden: encoder hidden widths (decoder mirrors them); TIGER: 512, 256, 128.
        latent: latent width (TIGER: 32).
        epochs, batch_size, lr, weight_decay: AdamW training (reference: lr 1e-3, wd 1e-4,
            batch 1024, thousands of epochs).
        beta: commitment weight (0.25).
        dead_code_reset: after an epoch, codes no item used are moved onto random residuals of
            their level (a cheap stand-in for balanced assignment; off shows raw collapse).
        checkpoint: ``"best_collision"`` keeps the epoch with the lowest collision rate (the
            reference's ``best_collision_model.pth``; ties -> later epoch), ``"last"`` the last.
    """

    name: ClassVar[str] = "rq-vae"

    hidden: list[int] = field(default_factory=lambda: [512, 256, 128])
    latent: int = 32
    epochs: int = 100
    batch_size: int = 1024
    lr: float = 1e-3
    weight_decay: float = 1e-4
    beta: float = 0.25
    dead_code_reset: bool = True
    checkpoint: str = "best_collision"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.checkpoint not in ("best_collision", "last"):
            raise ValueError(f"checkpoint must be 'best_collision' or 'last', got {self.checkpoint!r}")
        if self.epochs < 0 or self.batch_size < 1 or self.latent < 1:
            raise ValueError("epochs must be >= 0, batch_size >= 1, latent >= 1")

    def _quantize(self, x: Tensor, sizes: list[int], seed: int) -> tuple[np.ndarray, dict[str, Any]]:
        dev = torch.device(self.device)
        x = x.to(dev)
        gen = self._generator(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            encoder = _mlp([x.shape[1], *self.hidden, self.latent]).to(dev)
            decoder = _mlp([self.latent, *reversed(self.hidden), x.shape[1]]).to(dev)
        vq = _ResidualVQ(sizes, self.latent).to(dev)
        with torch.no_grad():
            _, books, _, _ = residual_kmeans(encoder(x), sizes, gen)
            for param, book in zip(vq.books, books):
                param.copy_(book)

        def evaluate() -> tuple[float, np.ndarray, list[Tensor]]:
            with torch.no_grad():
                z = encoder(x)
                st, codes, _, residuals = vq(z, self.beta)
                recon = float(((decoder(st) - x) ** 2).mean())
            return recon, codes.cpu().numpy(), residuals

        recon0, codes0, _ = evaluate()
        params = [*encoder.parameters(), *decoder.parameters(), *vq.parameters()]
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        curves: dict[str, list[Any]] = {k: [] for k in ("epoch", "loss", "reconstruction_loss", "usage", "perplexity",
                                                       "collision_rate", "dead_codes_reset")}  # fmt: skip
        n = len(x)
        best_state: dict[str, Any] | None = None
        best_rate = math.inf
        for epoch in range(1, self.epochs + 1):
            counts = [torch.zeros(s, dtype=torch.long, device=dev) for s in sizes]
            perm = torch.randperm(n, generator=gen).to(dev)
            total = recon_total = 0.0
            for i in range(0, n, self.batch_size):
                xb = x[perm[i : i + self.batch_size]]
                st, codes, vq_loss, _ = vq(encoder(xb), self.beta)
                recon = ((decoder(st) - xb) ** 2).mean()
                loss = recon + vq_loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(xb)
                recon_total += float(recon.detach()) * len(xb)
                for lvl, c in enumerate(counts):
                    c += torch.bincount(codes[:, lvl], minlength=len(c))
            usage, ppl = [], []
            for c in counts:
                p = c[c > 0].double() / c.sum()
                usage.append(float((c > 0).double().mean()))
                ppl.append(float(torch.exp(-(p * p.log()).sum())))
            _, eval_codes, residuals = evaluate()
            reset = 0
            if self.dead_code_reset:
                with torch.no_grad():
                    for lvl, (c, book) in enumerate(zip(counts, vq.books)):
                        dead = torch.nonzero(c == 0).flatten()
                        if len(dead):
                            pick = torch.randint(n, (len(dead),), generator=gen).to(dev)
                            book[dead] = residuals[lvl][pick]
                            reset += len(dead)
                if reset:
                    _, eval_codes, _ = evaluate()  # the state that a checkpoint of this epoch holds
            rate = _collision_stats(eval_codes)["collision_rate_before"]
            for key, value in (("epoch", epoch), ("loss", total / n), ("reconstruction_loss", recon_total / n),
                               ("usage", usage), ("perplexity", ppl), ("collision_rate", rate),
                               ("dead_codes_reset", reset)):  # fmt: skip
                curves[key].append(value)
            if self.checkpoint == "best_collision" and rate <= best_rate:
                best_rate = rate
                best_state = copy.deepcopy(
                    {"encoder": encoder.state_dict(), "decoder": decoder.state_dict(), "vq": vq.state_dict()}
                )
                best_state["epoch"] = epoch
        chosen = self.epochs
        if best_state is not None:
            encoder.load_state_dict(best_state["encoder"])
            decoder.load_state_dict(best_state["decoder"])
            vq.load_state_dict(best_state["vq"])
            chosen = best_state["epoch"]
        recon, codes, _ = evaluate()
        return codes.astype(np.int64), {
            "reconstruction_loss_initial": recon0,
            "reconstruction_loss": recon,
            "collision_rate_initial": _collision_stats(codes0)["collision_rate_before"],
            "checkpoint_epoch": chosen,
            "training": curves,
        }


def builder_names() -> list[str]:
    """Registered codebook builders."""
    return CodebookBuilder.registered_names()
