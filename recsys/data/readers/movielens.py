"""MovieLens-100K as a CTR dataset: a rating of ``click_threshold`` or more is a click."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from recsys.data.raw import DataError, RawData, ReadReport, resolve_data_path
from recsys.data.readers.base import Reader
from recsys.data.readers.lines import check_parsed, int_strings, parse_table, read_bytes, scan_lines, to_float
from recsys.data.schema import FeatureKind, FeatureSpec, Schema

__all__ = ["AGE_BUCKETS", "GENRES", "MovieLensReader"]

#: genre names in the order of ``u.genre`` (used when that file is absent)
GENRES = [
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
    "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
]  # fmt: skip
#: MovieLens-1M style age groups: (lower bound inclusive, label)
AGE_BUCKETS = [(0, "<18"), (18, "18-24"), (25, "25-34"), (35, "35-44"), (45, "45-49"), (50, "50-55"), (56, "56+")]
_WEEKDAYS = np.array(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], dtype=object)
_DEFAULT = "ml-100k"
FEATURES = [
    "user_id", "item_id", "age", "gender", "occupation", "zip_prefix", "genres", "release_year", "hour", "weekday",
]  # fmt: skip
#: characters of the zip code kept in ``zip_prefix`` (the US 3-digit sectional centre; 382 values in ml-100k)
ZIP_PREFIX_LEN = 3


class MovieLensReader(Reader):
    """Reads MovieLens-100K ratings joined with user and movie side information.

    Label: ``rating >= click_threshold`` (1) else 0. Features (all strings):

    * ``user_id``, ``item_id``: the raw ids.
    * ``age``: MovieLens-1M age group (``<18``, ``18-24``, ``25-34``, ``35-44``, ``45-49``,
      ``50-55``, ``56+``); ``gender`` (``M``/``F``); ``occupation``.
    * ``zip_prefix``: the first 3 characters of the zip code (US sectional centre; a few zips
      are Canadian postcodes and keep their first 3 characters too).
    * ``genres``: multi-categorical, the movie's genre names joined by ``|`` in ``u.genre``
      order (every ml-100k movie has at least one, ``unknown`` included).
    * ``release_year``: year of ``release_date`` (``""`` when missing).
    * ``hour`` (``"0"``..``"23"``) and ``weekday`` (``Mon``..``Sun``) of the rating timestamp, UTC.

    The frame also carries the ``timestamp`` column (int64 Unix seconds, not a feature) for
    temporal splits. Its index is the 1-based line number in ``ratings_file``.

    Args:
        path: the ml-100k folder (default ``ml-100k`` under ``$SALIENCE_DATA_DIR``).
        ratings_file: ratings file inside the folder: ``u.data`` or a split such as
            ``u1.base.gz`` / ``ua.test.gz`` (gzip detected from the content).
        click_threshold: smallest rating that counts as a click.
        embedding_dim: embedding width of every feature.
        min_count: vocabulary threshold of every feature.
    """

    name = "movielens"

    def __init__(
        self,
        path: str | None = None,
        ratings_file: str = "u.data",
        click_threshold: int = 4,
        embedding_dim: int = 16,
        min_count: int = 1,
    ) -> None:
        self.path = path
        self.ratings_file = ratings_file
        self.click_threshold = click_threshold
        self.embedding_dim = embedding_dim
        self.min_count = min_count

    def _root(self) -> Path:
        root = resolve_data_path(self.path, _DEFAULT)
        if not root.is_dir():
            raise FileNotFoundError(f"MovieLens path {root} is not a folder (expected the ml-100k folder)")
        return root

    def files(self) -> list[Path]:
        root = self._root()
        out = [root / self.ratings_file, root / "u.user", root / "u.item"]
        missing = [str(p) for p in out if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"MovieLens file(s) not found: {missing}; {root} holds {sorted(p.name for p in root.iterdir())}"
            )
        if (root / "u.genre").is_file():
            out.append(root / "u.genre")
        return out

    def build_schema(self) -> Schema:
        """The MovieLens schema built from this reader's options."""
        feats = [
            FeatureSpec(
                n,
                FeatureKind.MULTI_CATEGORICAL if n == "genres" else FeatureKind.CATEGORICAL,
                embedding_dim=self.embedding_dim,
                min_count=self.min_count,
            )
            for n in FEATURES
        ]
        return Schema(features=tuple(feats), label="label", name=self.name)

    def read(self) -> RawData:
        paths = self.files()
        ratings_path, user_path, item_path = paths[:3]
        genres = _read_genres(paths[3]) if len(paths) > 3 else GENRES
        source = str(ratings_path)
        report = ReadReport(source=source)

        ratings = _read_table(ratings_path, "\t", ["user_id", "item_id", "rating", "timestamp"], report)
        ratings = to_float(ratings, ["user_id", "item_id", "rating", "timestamp"], source=source, report=report,
                           integer=True)
        for col in ratings.columns:
            nan = ratings[col].isna().to_numpy()
            if nan.any():
                raise DataError(f"{source}:{ratings.index[np.argmax(nan)]}: column {col!r} is empty")
        users = _read_users(user_path)
        items = _read_items(item_path, genres)

        uid = ratings["user_id"].to_numpy(dtype=np.int64)
        iid = ratings["item_id"].to_numpy(dtype=np.int64)
        upos = users.index.get_indexer(uid)
        ipos = items.index.get_indexer(iid)
        for pos, ids, what, where in ((upos, uid, "user_id", user_path), (ipos, iid, "item_id", item_path)):
            if (pos < 0).any():
                i = int(np.argmax(pos < 0))
                raise DataError(f"{source}:{ratings.index[i]}: {what} {ids[i]} is not in {where}")

        ts = ratings["timestamp"].to_numpy(dtype=np.int64)
        when = pd.to_datetime(ts, unit="s", utc=True)
        frame = pd.DataFrame(
            {
                "user_id": int_strings(uid, ratings.index),
                "item_id": int_strings(iid, ratings.index),
                "age": users["age"].to_numpy()[upos],
                "gender": users["gender"].to_numpy()[upos],
                "occupation": users["occupation"].to_numpy()[upos],
                "zip_prefix": users["zip_prefix"].to_numpy()[upos],
                "genres": items["genres"].to_numpy()[ipos],
                "release_year": items["release_year"].to_numpy()[ipos],
                "hour": int_strings(when.hour.to_numpy(), ratings.index),
                "weekday": _WEEKDAYS[when.day_of_week.to_numpy()],
                "timestamp": ts,
                "label": (ratings["rating"].to_numpy() >= self.click_threshold).astype(np.int8),
            },
            index=ratings.index,
        )
        for col in FEATURES:
            frame[col] = frame[col].astype(str)
        report.rows_read = len(frame)
        report.notes["click_threshold"] = self.click_threshold
        return RawData(frame=frame, schema=self.build_schema(), report=report)


def _read_table(path: Path, sep: str, names: list[str], report: ReadReport, encoding: str = "utf-8") -> pd.DataFrame:
    """A headerless ``sep``-separated file as strings, indexed by line; bad field count -> DataError."""
    source = str(path)
    scanned = scan_lines(
        read_bytes(path), source=source, sep=sep, expected=len(names), report=report, encoding=encoding
    )
    frame = parse_table(scanned.data, source=source, sep=sep, names=names, encoding=encoding)
    return check_parsed(frame, scanned.lines, source)


def _read_genres(path: Path) -> list[str]:
    """Genre names ordered by their index in ``u.genre`` (``name|index`` lines, blank lines ignored)."""
    pairs = []
    for n, line in enumerate(path.read_text(encoding="latin-1").splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, idx = line.rpartition("|")
        if not sep or not idx.strip().isdigit():
            raise DataError(f"{path}:{n}: expected 'genre|index', found {line!r}")
        pairs.append((int(idx), name))
    pairs.sort()
    if [i for i, _ in pairs] != list(range(len(pairs))):
        raise DataError(f"{path}: genre indices are not 0..{len(pairs) - 1}")
    return [name for _, name in pairs]


def _read_users(path: Path) -> pd.DataFrame:
    """``u.user`` as features, indexed by integer user id."""
    source = str(path)
    users = _read_table(path, "|", ["user_id", "age", "gender", "occupation", "zip"], ReadReport(source))
    users = to_float(users, ["user_id", "age"], source=source, report=ReadReport(source), integer=True)
    age = users["age"].to_numpy()
    bounds = np.array([b for b, _ in AGE_BUCKETS[1:]], dtype=np.float64)
    labels = np.array([lbl for _, lbl in AGE_BUCKETS], dtype=object)
    users["age"] = np.where(np.isnan(age), "", labels[np.searchsorted(bounds, np.nan_to_num(age), side="right")])
    users["zip_prefix"] = users["zip"].str.strip().str.slice(0, ZIP_PREFIX_LEN)
    return users.set_index(users["user_id"].astype(np.int64).rename(None))


def _read_items(path: Path, genres: list[str]) -> pd.DataFrame:
    """``u.item`` (Latin-1) as features, indexed by integer movie id: genres and release year."""
    source = str(path)
    names = ["item_id", "title", "release_date", "video_release_date", "url", *[f"g{i}" for i in range(len(genres))]]
    items = _read_table(path, "|", names, ReadReport(source), encoding="latin-1")
    flag_cols = names[5:]
    items = to_float(items, ["item_id", *flag_cols], source=source, report=ReadReport(source), integer=True)
    flags = items[flag_cols].to_numpy()
    if not np.isin(flags, [0.0, 1.0]).all():
        r, c = np.argwhere(~np.isin(flags, [0.0, 1.0]))[0]
        raise DataError(f"{source}:{items.index[r]}: genre flag {genres[c]!r} is not 0 or 1")
    # "|"-join the names of the set flags, vectorised: per genre, append "name|" where set
    joined = pd.Series("", index=items.index, dtype=object)
    for c, g in enumerate(genres):
        joined = joined + np.where(flags[:, c] == 1.0, g + "|", "")
    items["genres"] = joined.str.rstrip("|")
    year = items["release_date"].str.strip().str.slice(-4)
    items["release_year"] = year.where(year.str.fullmatch(r"\d{4}"), "")
    return items.set_index(items["item_id"].astype(np.int64).rename(None))
