"""Next-item sequence data: readers, the leave-one-out split, head/tail items, a synthetic generator.

Every reader returns a :class:`SequenceData`: one chronological item sequence per user, items
remapped to ``1..num_items`` (``0`` is padding, see :mod:`generative.base`), with the raw ids
kept as ``item_labels`` and the item content (attribute ids, titles) aligned to the indices.

    data = load_sequences("beauty")            # $SALIENCE_DATA_DIR/amazon-5core-s3rec
    split = leave_one_out(data, max_history=20)
    history, target = split.as_tensors("train")  # [n, 20] int64 left-padded, [n]
    tail = tail_items(split.item_counts)        # bool [num_items + 1]

Datasets (:func:`load_sequences` names):

* ``beauty``, ``sports``, ``toys``: Amazon 5-core as prepared by S3-Rec
  (``<Category>.txt[.gz]``: ``user item item ...`` per line, chronological), item attributes
  from ``<Category>_item2attributes.json[.gz]`` (brand + category ids). ``item_labels`` are the
  ASINs when ``<Short>_user_sequence_asin.txt[.gz]`` lines up with the integer file (same users,
  same lengths, a consistent one-to-one id <-> ASIN map: true for Beauty and Sports), else the
  integer ids as strings (Toys, whose ASIN file has another user order). No titles.
* ``ml-100k``: every rating of ``u.data`` is an interaction, ordered by timestamp per user
  (ties by item id); ``item_titles`` are ``"<title> | <genre>, <genre>"`` from ``u.item``;
  ``item_attributes`` are the genre ids of ``u.genre`` (0..18).
* ``synthetic``: :func:`synthetic_sequences` with its defaults (no files).

Bad input (every reader goes through :meth:`SequenceData.from_raw`):

* a malformed line (non-integer id, wrong field count) raises :class:`~recsys.data.raw.DataError`
  (a ``ValueError``) naming ``path:line``; a malformed attribute file names the path and key;
* interactions with an item id outside the catalogue are **dropped and counted**
  (``report["unknown_items_dropped"]``); attribute entries of ids outside the catalogue are
  ignored and counted (``attribute_items_unknown``);
* users left with fewer than ``min_length`` interactions are dropped and counted
  (``users_dropped_short``);
* an empty catalogue, or no user left, raises ``ValueError``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor

from recsys.data.raw import DataError, resolve_data_path
from recsys.data.readers.lines import read_bytes

__all__ = [
    "AMAZON_DATASETS", "DATASETS", "LeaveOneOut", "SequenceData", "SequenceDataset", "leave_one_out", "load_sequences",
    "synthetic_sequences", "tail_items",
]  # fmt: skip

#: dataset name -> (stem of the sequence/attribute files, stem of the ASIN file)
AMAZON_DATASETS = {
    "beauty": ("Beauty", "Beauty"),
    "sports": ("Sports_and_Outdoors", "Sports"),
    "toys": ("Toys_and_Games", "Toys"),
}
#: every name :func:`load_sequences` accepts
DATASETS = (*AMAZON_DATASETS, "ml-100k", "synthetic")
#: the names :func:`load_sequences` reads, as a config type (equal to :data:`DATASETS`, tested)
SequenceDataset = Literal["beauty", "sports", "toys", "ml-100k", "synthetic"]
AMAZON_FOLDER = "amazon-5core-s3rec"
ML100K_FOLDER = "ml-100k"
#: ml-100k genre names (``u.genre`` order), used when ``u.genre`` is absent
ML100K_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
    "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip
PAD_LABEL = "<pad>"
_EMPTY = np.empty(0, dtype=np.int64)


@dataclass
class SequenceData:
    """Per-user chronological item sequences over a catalogue of ``num_items`` items.

    Attributes:
        name: dataset name.
        sequences: one int64 array per user, item indices in ``1..num_items``, oldest first.
        num_items: catalogue size N (items may have no interaction, see the report).
        item_labels: ``N + 1`` display labels (raw id, ASIN, ...); index 0 is ``"<pad>"``.
        item_attributes: ``N + 1`` int64 arrays of attribute ids (index 0 and items without
            attributes: empty), or None when the dataset has no attributes.
        item_titles: ``N + 1`` item texts (index 0: ``""``), or None when the dataset has none.
        report: counts of what the reader saw and dropped (``users``, ``items``,
            ``interactions``, ``users_dropped_short``, ``unknown_items_dropped``,
            ``items_without_interactions``, ...).
    """

    name: str
    sequences: list[np.ndarray]
    num_items: int
    item_labels: list[str]
    item_attributes: list[np.ndarray] | None = None
    item_titles: list[str] | None = None
    report: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for what, values in (
            ("item_labels", self.item_labels),
            ("item_attributes", self.item_attributes),
            ("item_titles", self.item_titles),
        ):
            if values is not None and len(values) != self.num_items + 1:
                raise ValueError(
                    f"{self.name}: {what} has {len(values)} entries, expected num_items + 1 = {self.num_items + 1}"
                )

    @property
    def num_users(self) -> int:
        return len(self.sequences)

    @property
    def num_interactions(self) -> int:
        return int(sum(len(s) for s in self.sequences))

    @classmethod
    def from_raw(
        cls,
        name: str,
        sequences: Iterable[ArrayLike],
        *,
        catalogue: ArrayLike | None = None,
        labels: Mapping[int, str] | None = None,
        attributes: Mapping[int, ArrayLike] | None = None,
        titles: Mapping[int, str] | None = None,
        min_length: int = 3,
        report: Mapping[str, int] | None = None,
        source: str | None = None,
    ) -> SequenceData:
        """Build from raw integer item ids: remap to ``1..N``, drop unknown items and short users.

        Args:
            name: dataset name.
            sequences: per user, raw item ids in chronological order.
            catalogue: the raw ids of the catalogue (any integers); default: every id seen in
                ``sequences``. Index ``i`` is the ``i``-th smallest raw id.
            labels: raw id -> display label (default ``str(raw id)``).
            attributes: raw id -> attribute ids; catalogue items without an entry get none.
            titles: raw id -> text; catalogue items without an entry get their label.
            min_length: users with fewer interactions (after dropping unknown items) are dropped.
            report: counts to start the report with (a reader's own notes).
            source: what to name in error messages (default ``name``).

        Raises:
            ValueError: empty catalogue, ``min_length < 1``, or no user left.
        """
        source = source or name
        if min_length < 1:
            raise ValueError(f"min_length must be >= 1, got {min_length}")
        raw = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sequences]
        flat = np.concatenate(raw) if raw else _EMPTY
        cat = np.unique(flat) if catalogue is None else np.unique(np.asarray(catalogue, dtype=np.int64))
        if cat.size == 0:
            raise ValueError(f"{source}: the item catalogue is empty (no items)")
        num_items = int(cat.size)
        pos = np.minimum(np.searchsorted(cat, flat), num_items - 1)
        known = cat[pos] == flat
        lengths = np.array([len(s) for s in raw], dtype=np.int64)
        owner = np.repeat(np.arange(len(raw)), lengths)[known]
        kept_lengths = np.bincount(owner, minlength=len(raw))
        per_user = np.split(pos[known] + 1, np.cumsum(kept_lengths)[:-1]) if raw else []
        long_enough = kept_lengths >= min_length
        seqs = [s for s, ok in zip(per_user, long_enough) if ok]
        if not seqs:
            raise ValueError(
                f"{source}: no user has at least min_length={min_length} known interactions ({len(raw)} users read)"
            )

        out: dict[str, int] = dict(report or {})
        counts = np.bincount(np.concatenate(seqs), minlength=num_items + 1)
        out.update(
            users=len(seqs),
            items=num_items,
            interactions=int(counts.sum()),
            users_dropped_short=int((~long_enough).sum()),
            unknown_items_dropped=int((~known).sum()),
            items_without_interactions=int((counts[1:] == 0).sum()),
        )
        raw_ids = cat.tolist()
        item_labels = [PAD_LABEL] + [str(labels.get(r, r)) if labels else str(r) for r in raw_ids]
        item_attributes = None
        if attributes is not None:
            item_attributes = [_EMPTY] + [
                np.asarray(attributes.get(r, _EMPTY), dtype=np.int64).reshape(-1) for r in raw_ids
            ]
            keys = np.fromiter(attributes.keys(), np.int64, len(attributes))
            out["attribute_items_unknown"] = int(np.count_nonzero(~np.isin(keys, cat)))
            out["items_without_attributes"] = sum(1 for a in item_attributes[1:] if a.size == 0)
        item_titles = None
        if titles is not None:
            item_titles = [""] + [titles.get(r, lab) for r, lab in zip(raw_ids, item_labels[1:])]
            out["items_without_title"] = sum(1 for r in raw_ids if r not in titles)
        return cls(name, seqs, num_items, item_labels, item_attributes, item_titles, out)


# ---------------------------------------------------------------------------------------------
# leave-one-out split and head/tail items


@dataclass
class LeaveOneOut:
    """The leave-one-out split of :func:`leave_one_out`; histories are left-padded with 0.

    Attributes:
        train_history: ``[n_train, max_history]`` int64, one row per prefix of ``items[:-2]``.
        train_target: ``[n_train]`` int64, the item following that prefix.
        valid_history / valid_target: ``[U, max_history]`` / ``[U]``: ``items[:-2]`` -> ``items[-2]``.
        test_history / test_target: ``[U, max_history]`` / ``[U]``: ``items[:-1]`` -> ``items[-1]``.
        num_items: catalogue size N.
        max_history: history width T.
        item_counts: ``[N + 1]`` int64 interactions per item in the training part (``items[:-2]``
            of every user; index 0 is 0).
    """

    train_history: np.ndarray
    train_target: np.ndarray
    valid_history: np.ndarray
    valid_target: np.ndarray
    test_history: np.ndarray
    test_target: np.ndarray
    num_items: int
    max_history: int
    item_counts: np.ndarray

    PARTS = ("train", "valid", "test")

    def arrays(self, part: str) -> tuple[np.ndarray, np.ndarray]:
        """``(history [n, T], target [n])`` of ``part`` (``train``, ``valid`` or ``test``)."""
        if part not in self.PARTS:
            raise ValueError(f"unknown split part {part!r}; expected one of {list(self.PARTS)}")
        return getattr(self, f"{part}_history"), getattr(self, f"{part}_target")

    def as_tensors(self, part: str) -> tuple[Tensor, Tensor]:
        """``(history [n, T], target [n])`` of ``part`` as int64 torch tensors (shared memory)."""
        history, target = self.arrays(part)
        return torch.from_numpy(np.ascontiguousarray(history)), torch.from_numpy(np.ascontiguousarray(target))


def _windows(flat: np.ndarray, pos: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
    """``[len(pos), width]``: ``flat[max(start, pos - width):pos]`` per row, left-padded with 0."""
    idx = pos[:, None] + np.arange(-width, 0, dtype=np.int64)[None, :]
    inside = idx >= start[:, None]
    return np.where(inside, flat[np.maximum(idx, 0)], 0).astype(np.int64, copy=False)


def leave_one_out(data: SequenceData, max_history: int = 20) -> LeaveOneOut:
    """Split every user's sequence ``s`` (length n >= 3) the TIGER / S3-Rec way.

    * train: for ``t = 1 .. n-3``: history ``s[max(0, t-T):t]`` -> target ``s[t]`` (every prefix
      of ``s[:-2]`` to its next item), users in order, ``t`` increasing;
    * valid: ``s[:-2][-T:]`` -> ``s[-2]``; test: ``s[:-1][-T:]`` -> ``s[-1]`` (one row per user).

    Args:
        data: the sequences.
        max_history: T, the number of most recent items kept (columns of every history).

    Raises:
        ValueError: ``max_history < 1`` or a user with fewer than 3 items.
    """
    if max_history < 1:
        raise ValueError(f"max_history must be >= 1, got {max_history}")
    lengths = np.array([len(s) for s in data.sequences], dtype=np.int64)
    if lengths.size == 0:
        raise ValueError(f"{data.name}: no users")
    short = np.flatnonzero(lengths < 3)
    if short.size:
        raise ValueError(
            f"{data.name}: user {int(short[0])} has {int(lengths[short[0]])} items; leave-one-out needs "
            f"at least 3 per user ({short.size} such users; load with min_length=3)"
        )
    flat = np.concatenate(data.sequences).astype(np.int64, copy=False)
    starts = np.cumsum(lengths) - lengths

    n_train = lengths - 3
    user = np.repeat(np.arange(lengths.size), n_train)
    first = np.cumsum(n_train) - n_train
    t = np.arange(int(n_train.sum()), dtype=np.int64) - np.repeat(first, n_train) + 1
    pos = starts[user] + t
    train_history = _windows(flat, pos, starts[user], max_history)

    valid_pos, test_pos = starts + lengths - 2, starts + lengths - 1
    in_train = np.arange(flat.size) - np.repeat(starts, lengths) < np.repeat(lengths - 2, lengths)
    return LeaveOneOut(
        train_history=train_history,
        train_target=flat[pos],
        valid_history=_windows(flat, valid_pos, starts, max_history),
        valid_target=flat[valid_pos],
        test_history=_windows(flat, test_pos, starts, max_history),
        test_target=flat[test_pos],
        num_items=data.num_items,
        max_history=max_history,
        item_counts=np.bincount(flat[in_train], minlength=data.num_items + 1).astype(np.int64),
    )


def tail_items(item_counts: np.ndarray, share: float = 0.2) -> np.ndarray:
    """The tail: the least popular items that together hold at most ``share`` of the interactions.

    Items ``1..N`` are sorted by count, ascending (ties by index), and taken while the running
    total stays ``<= share * total``; items never seen in training are always tail.

    Args:
        item_counts: ``[N + 1]`` training interactions per item (index 0 ignored).
        share: fraction of the training interactions the tail may cover, in ``[0, 1]``.

    Returns:
        bool ``[N + 1]``, True for tail items (index 0 is False).
    """
    counts = np.asarray(item_counts)
    if counts.ndim != 1 or counts.size < 2:
        raise ValueError(f"item_counts must be 1-D with num_items + 1 >= 2 entries, got shape {counts.shape}")
    if (counts < 0).any():
        raise ValueError("item_counts must be non-negative")
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    order = np.argsort(counts[1:], kind="stable") + 1
    running = np.cumsum(counts[order])
    tail = np.zeros(counts.size, dtype=bool)
    tail[order[running <= share * counts[1:].sum()]] = True
    return tail


# ---------------------------------------------------------------------------------------------
# readers


def load_sequences(name: str, data_dir: str | Path | None = None, min_length: int = 3) -> SequenceData:
    """Read a next-item dataset by name (see the module docstring for the names and bad input).

    Args:
        name: one of :data:`DATASETS`.
        data_dir: the dataset folder (``.../amazon-5core-s3rec`` or ``.../ml-100k``) or a folder
            holding it (such as ``$SALIENCE_DATA_DIR``); default: looked up under
            ``$SALIENCE_DATA_DIR``. Ignored for ``synthetic``.
        min_length: users with fewer interactions are dropped (counted in the report).
    """
    key = name.lower()
    if key == "synthetic":
        return synthetic_sequences(min_length=min_length)
    if key in AMAZON_DATASETS:
        return _read_amazon(key, _dataset_root(data_dir, AMAZON_FOLDER), min_length)
    if key in ("ml-100k", "ml100k", "movielens"):
        return _read_ml100k(_dataset_root(data_dir, ML100K_FOLDER), min_length)
    raise ValueError(f"unknown sequence dataset {name!r}; available: {list(DATASETS)}")


def _dataset_root(data_dir: str | Path | None, folder: str) -> Path:
    if data_dir is not None and (Path(data_dir) / folder).is_dir():
        return Path(data_dir) / folder
    root = resolve_data_path(data_dir, folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder (expected the {folder} folder or one holding it)")
    return root


def _find(root: Path, stem: str, required: bool = True) -> Path | None:
    for candidate in (root / f"{stem}.gz", root / stem):
        if candidate.is_file():
            return candidate
    if required:
        raise FileNotFoundError(f"{root / stem}[.gz] not found; {root} holds {sorted(p.name for p in root.iterdir())}")
    return None


def _lines(path: Path, encoding: str = "utf-8") -> list[str]:
    return read_bytes(path).decode(encoding).splitlines()


def _int_tokens(tokens: Sequence[str], path: Path, line: int, what: str = "item id") -> np.ndarray:
    try:
        return np.array([int(tok) for tok in tokens], dtype=np.int64)
    except ValueError:
        bad = next(tok for tok in tokens if not _is_int(tok))
        raise DataError(f"{path}:{line}: {what} {bad!r} is not an integer") from None


def _is_int(token: str) -> bool:
    try:
        int(token)
    except ValueError:
        return False
    return True


def _read_id_sequences(path: Path) -> tuple[list[np.ndarray], list[int]]:
    """``user item item ...`` lines -> (item id arrays, 1-based line numbers); blank lines skipped."""
    seqs: list[np.ndarray] = []
    line_numbers: list[int] = []
    for number, line in enumerate(_lines(path), 1):
        parts = line.split()
        if not parts:
            continue
        seqs.append(_int_tokens(parts[1:], path, number))
        line_numbers.append(number)
    return seqs, line_numbers


def _read_attributes(path: Path) -> dict[int, np.ndarray]:
    try:
        obj = json.loads(read_bytes(path).decode("utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected one JSON object {{item id: [attribute ids]}}, got {type(obj).__name__}")
    out: dict[int, np.ndarray] = {}
    for key, values in obj.items():
        if not _is_int(key):
            raise DataError(f"{path}: key {key!r} is not an integer item id")
        if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise DataError(f"{path}: item {key}: attributes must be a list of integers, got {values!r:.80}")
        out[int(key)] = np.array(values, dtype=np.int64)
    return out


def _asin_labels(path: Path | None, seqs: list[np.ndarray]) -> dict[int, str] | None:
    """id -> ASIN when the ASIN file lines up with ``seqs`` one to one, else None."""
    if path is None:
        return None
    rows = [line.split()[1:] for line in _lines(path) if line.strip()]
    if len(rows) != len(seqs) or any(len(r) != len(s) for r, s in zip(rows, seqs)):
        return None
    ids = np.concatenate(seqs).tolist() if seqs else []
    asins = [a for r in rows for a in r]
    mapping = dict(zip(ids, asins))
    if len(set(mapping.values())) != len(mapping) or any(mapping[i] != a for i, a in zip(ids, asins)):
        return None
    return mapping


def _read_amazon(key: str, root: Path, min_length: int) -> SequenceData:
    stem, short = AMAZON_DATASETS[key]
    seq_path = _find(root, f"{stem}.txt")
    assert seq_path is not None
    seqs, _ = _read_id_sequences(seq_path)
    attr_path = _find(root, f"{stem}_item2attributes.json", required=False)
    attributes = _read_attributes(attr_path) if attr_path is not None else None
    labels = _asin_labels(_find(root, f"{short}_user_sequence_asin.txt", required=False), seqs)
    catalogue = np.unique(np.concatenate(seqs)) if seqs else _EMPTY
    return SequenceData.from_raw(
        key,
        seqs,
        catalogue=catalogue,
        labels=labels,
        attributes=attributes,
        min_length=min_length,
        report={"asin_labels": int(labels is not None)},
        source=str(seq_path),
    )


def _read_ml100k(root: Path, min_length: int) -> SequenceData:
    data_path, item_path = _find(root, "u.data"), _find(root, "u.item")
    assert data_path is not None and item_path is not None
    genre_path = _find(root, "u.genre", required=False)
    genres = list(ML100K_GENRES)
    if genre_path is not None:
        genres = [ln.split("|")[0] for ln in _lines(genre_path, "latin-1") if ln.strip()]

    titles: dict[int, str] = {}
    attributes: dict[int, np.ndarray] = {}
    for number, line in enumerate(_lines(item_path, "latin-1"), 1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) < 5 + len(genres):
            raise DataError(
                f"{item_path}:{number}: expected {5 + len(genres)} '|'-separated fields, got {len(fields)}"
            )
        item = int(_int_tokens(fields[:1], item_path, number, "movie id")[0])
        flags = fields[-len(genres) :]
        if any(f not in ("0", "1") for f in flags):
            raise DataError(f"{item_path}:{number}: genre flags must be 0/1, got {flags}")
        genre_ids = [g for g, f in enumerate(flags) if f == "1"]
        attributes[item] = np.array(genre_ids, dtype=np.int64)
        titles[item] = f"{fields[1]} | {', '.join(genres[g] for g in genre_ids)}"
    if not titles:
        raise ValueError(f"{item_path}: the item catalogue is empty (no movies)")

    rows = []
    for number, line in enumerate(_lines(data_path, "latin-1"), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4:
            raise DataError(f"{data_path}:{number}: expected 4 fields (user item rating timestamp), got {len(parts)}")
        rows.append(_int_tokens(parts, data_path, number, "field"))
    if not rows:
        raise ValueError(f"{data_path}: no ratings")
    table = np.stack(rows)
    users, items, stamps = table[:, 0], table[:, 1], table[:, 3]
    order = np.lexsort((items, stamps, users))
    users, items = users[order], items[order]
    bounds = np.flatnonzero(np.diff(users)) + 1
    seqs = np.split(items, bounds)
    return SequenceData.from_raw(
        "ml-100k",
        seqs,
        catalogue=np.fromiter(titles, np.int64, len(titles)),
        attributes=attributes,
        titles=titles,
        min_length=min_length,
        source=str(data_path),
    )


# ---------------------------------------------------------------------------------------------
# synthetic data with planted structure

_TOPICS = (
    "kitchen knife", "garden hose", "running shoe", "lipstick", "board game", "camping tent", "mystery novel",
    "acoustic guitar", "laptop bag", "coffee grinder", "yoga mat", "baby stroller", "dog leash", "fishing rod",
    "wrist watch", "face cream",
)  # fmt: skip
_STYLES = ("red", "blue", "green", "black", "white", "vintage", "compact", "deluxe", "travel", "classic")


def synthetic_sequences(
    num_users: int = 2000,
    num_items: int = 500,
    num_clusters: int = 10,
    seed: int = 0,
    *,
    sub_clusters: int = 4,
    mean_length: float = 10.0,
    stay: float = 0.9,
    follow: float = 0.5,
    noise_attributes: int = 30,
    min_length: int = 3,
) -> SequenceData:
    """Sequences with planted, learnable structure; deterministic for a seed (~0.05 s by default).

    * Items ``1..N`` are split evenly at random into ``num_clusters`` clusters, each cluster into
      ``sub_clusters`` sub-clusters. Within a cluster, item popularity is Zipf-like (weight
      ``1 / rank``), and clusters themselves have Zipf weights ``1 / rank^0.5``: a head and a tail.
    * Every item has one *successor*, a random other item of its sub-cluster.
    * A user starts in a cluster drawn by cluster weight; at every step they leave for a new
      cluster (by weight) with probability ``1 - stay``; otherwise, with probability ``follow``,
      the next item is the previous item's successor, else a popularity draw from the current
      cluster. So the next item is predictable from the history (the successor, the cluster).
    * Lengths: ``5 + Poisson(mean_length - 5)``, at most 50.
    * Attributes of an item: ``[cluster + 1, C + cluster * S + sub + 1]`` plus 1-2 noise ids
      drawn from ``C + C*S + 1 .. C + C*S + noise_attributes`` (C clusters, S sub-clusters).
      So attribute id ``c + 1`` (``1..C``) is the planted cluster.
    * Titles: ``"<style> <topic> model <i>"`` where the topic names the cluster and the style
      the sub-cluster (for the text encoder).

    Returns:
        :class:`SequenceData` named ``synthetic``; items keep their index as label.
    """
    if num_items < num_clusters * sub_clusters or num_clusters < 1 or sub_clusters < 1:
        raise ValueError(
            f"need num_items >= num_clusters * sub_clusters >= 1, got {num_items} items, "
            f"{num_clusters} clusters x {sub_clusters} sub-clusters"
        )
    if num_users < 1:
        raise ValueError(f"num_users must be >= 1, got {num_users}")
    rng = np.random.default_rng(seed)
    cluster = rng.permutation(np.arange(num_items) % num_clusters)  # of item i + 1
    sub = np.empty(num_items, dtype=np.int64)
    weight = np.empty(num_items)
    for c in range(num_clusters):
        members = np.flatnonzero(cluster == c)
        sub[members] = rng.permutation(np.arange(members.size) % sub_clusters)
        weight[members] = 1.0 / (1.0 + rng.permutation(members.size))
    successor = np.empty(num_items, dtype=np.int64)
    for c in range(num_clusters):
        for s in range(sub_clusters):
            # a random cycle through the sub-cluster: each item's successor is the next one
            cycle = rng.permutation(np.flatnonzero((cluster == c) & (sub == s)))
            successor[cycle] = np.roll(cycle, -1)
    cluster_weight = 1.0 / np.sqrt(1.0 + rng.permutation(num_clusters))
    cluster_weight /= cluster_weight.sum()

    # popularity draw inside a cluster: cumulative weights in [c, c + 1) per cluster
    order = np.argsort(cluster, kind="stable")
    bounds = np.searchsorted(cluster[order], np.arange(num_clusters + 1))
    cum = np.empty(num_items)
    for c in range(num_clusters):
        part = np.cumsum(weight[order[bounds[c] : bounds[c + 1]]])
        cum[bounds[c] : bounds[c + 1]] = c + part / part[-1]
        cum[bounds[c + 1] - 1] = c + 1.0

    def draw(clusters: np.ndarray) -> np.ndarray:
        j = np.searchsorted(cum, clusters + rng.random(clusters.size) * (1 - 1e-9), side="right")
        return order[np.minimum(j, num_items - 1)]

    lengths = np.minimum(5 + rng.poisson(max(mean_length - 5.0, 0.0), num_users), 50)
    steps = np.zeros((num_users, int(lengths.max())), dtype=np.int64)
    current = rng.choice(num_clusters, num_users, p=cluster_weight)
    steps[:, 0] = draw(current)
    for t in range(1, steps.shape[1]):
        leave = rng.random(num_users) >= stay
        current = np.where(leave, rng.choice(num_clusters, num_users, p=cluster_weight), current)
        follows = ~leave & (rng.random(num_users) < follow)
        steps[:, t] = np.where(follows, successor[steps[:, t - 1]], draw(current))
    seqs = [steps[u, : lengths[u]] + 1 for u in range(num_users)]

    noise_base = num_clusters + num_clusters * sub_clusters
    n_noise = rng.integers(1, 3, num_items)
    attributes: dict[int, np.ndarray] = {}
    titles: dict[int, str] = {}
    for i in range(num_items):
        noise = (
            rng.choice(noise_attributes, n_noise[i], replace=False) + noise_base + 1 if noise_attributes else _EMPTY
        )
        attributes[i + 1] = np.concatenate(
            [[cluster[i] + 1, num_clusters + cluster[i] * sub_clusters + sub[i] + 1], noise]
        ).astype(np.int64)
        topic = _TOPICS[cluster[i]] if num_clusters <= len(_TOPICS) else f"category {cluster[i]}"
        style = _STYLES[sub[i]] if sub_clusters <= len(_STYLES) else f"style {sub[i]}"
        titles[i + 1] = f"{style} {topic} model {i + 1}"
    return SequenceData.from_raw(
        "synthetic",
        seqs,
        catalogue=np.arange(1, num_items + 1),
        attributes=attributes,
        titles=titles,
        min_length=min_length,
    )
