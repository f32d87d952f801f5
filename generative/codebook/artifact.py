"""The semantic-ID artifact: :class:`Codebook` (item <-> token tuple, its statistics and file
format) and the collision statistics every builder reports; see :mod:`generative.codebook`."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from recsys.artifacts import read_artifact, write_artifact

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from recsys.tracking import RunTracker

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Codebook",
    "CodebookError",
    "code_perplexity",
    "collision_groups",
    "min_codebook_size",
]

#: ``"format"`` field of a saved codebook
FORMAT = "salience-codebook"
#: version of the file format written by :meth:`Codebook.save`
FORMAT_VERSION = 1


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


def collision_stats(raw: np.ndarray) -> dict[str, Any]:
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
        return write_artifact(path, self.to_dict(), rows_key="codes")

    @classmethod
    def load(cls, path: str | Path, num_items: int | None = None) -> Codebook:
        """Read a :meth:`save` file; ``num_items`` checks it against the catalogue it is used with.

        Raises:
            FileNotFoundError: no such file.
            CodebookError: not a codebook, corrupt, or a different catalogue size (the message
                names the file).
        """
        path = Path(path)
        data = read_artifact(path, "codebook file", CodebookError)
        book = cls.from_dict(data, source=str(path))
        if num_items is not None and book.num_items != num_items:
            raise CodebookError(f"{path}: codebook covers {book.num_items} items but the catalogue has {num_items}")
        return book
