"""Typed description of a tabular recommendation dataset: one :class:`FeatureSpec` per field.

A :class:`Schema` is what every downstream component speaks: encoders are fitted from it,
batches are laid out in its feature order and models size their embedding tables from it.
It round-trips through JSON/YAML so a user's own data needs a schema file and no code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import Enum, unique
from functools import cached_property
from numbers import Integral, Real
from pathlib import Path
from typing import Any

__all__ = ["FLOAT32_MAX", "DenseTransform", "FeatureKind", "FeatureSpec", "Schema", "SchemaError"]


class SchemaError(ValueError):
    """A schema (or a config that names features) does not match the data."""


#: the largest finite float32: dense values beyond it cannot reach the model as numbers
FLOAT32_MAX = 3.4028234663852886e38


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


@unique
class FeatureKind(str, Enum):
    """What a field holds."""

    CATEGORICAL = "categorical"  # one id per row (user id, app, hashed Criteo C1..C26)
    MULTI_CATEGORICAL = "multi_categorical"  # a variable-length bag of ids per row (genres)
    DENSE = "dense"  # one float per row (Criteo I1..I13)
    VECTOR = "vector"  # a fixed-width float vector per row (a pre-computed embedding): one feature of width ``dim``


@unique
class DenseTransform(str, Enum):
    """Transform applied to a dense value before it reaches the model."""

    NONE = "none"  # keep the raw value
    LOG1P = "log1p"  # Criteo style: log(1 + max(x, 0)) for counts
    STANDARDIZE = "standardize"  # (x - mean) / std with statistics of the training split


@dataclass(frozen=True)
class FeatureSpec:
    """One input field.

    Args:
        name (str): column name in the raw data and key in the KJT.
        kind (FeatureKind): categorical, multi-categorical or dense.
        embedding_dim (int): width of this feature's embedding table (sparse kinds only).
        missing_value (str | float | None): raw value that means "missing"; for sparse kinds
            missing becomes its own category, for dense it is filled with ``fill_value``.
        min_count (int): categories seen fewer times in the training split map to the
            out-of-vocabulary id.
        hash_size (int | None): when set, categories are hashed into this many buckets instead
            of getting a vocabulary (``num_embeddings = hash_size + 1``, id 0 stays OOV).
        separator (str): separator of the ids inside one cell of a multi-categorical field.
        transform (DenseTransform): dense transform.
        fill_value (float): value used for missing, NaN or infinite dense inputs.
        num_embeddings (int | None): size of the embedding table; set by the encoders when they
            are fitted (vocabulary size + 1 for the OOV id at row 0).
        dim (int | None): the width D of a ``vector`` feature (required for it, unset otherwise).
        prefix (str | None): a ``vector`` feature's columns in a CSV/TSV file or a flat frame,
            ``f"{prefix}{i}"`` for i in 0..D-1 (default ``f"{name}_"``); a Parquet file may hold
            it as one list column named ``name`` instead.

    A ``vector`` feature is one feature of width D everywhere downstream: D columns of the dense
    block, one field at the seam, one gate of LeAP, D input dimensions in a selection report.
    """

    name: str
    kind: FeatureKind = FeatureKind.CATEGORICAL
    embedding_dim: int = 16
    missing_value: str | float | None = None
    min_count: int = 1
    hash_size: int | None = None
    separator: str = "|"
    transform: DenseTransform = DenseTransform.NONE
    fill_value: float = 0.0
    num_embeddings: int | None = None
    dim: int | None = None
    prefix: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError(f"feature name must be a non-empty string, got {self.name!r}")
        for key, enum in (("kind", FeatureKind), ("transform", DenseTransform)):
            try:
                object.__setattr__(self, key, enum(getattr(self, key)))
            except ValueError:
                self._invalid(key, f"one of {[e.value for e in enum]}")
        for key in ("embedding_dim", "min_count", "hash_size", "num_embeddings", "dim"):
            value = getattr(self, key)
            if not (_is_int(value) or (value is None and key in ("hash_size", "num_embeddings", "dim"))):
                self._invalid(key, "an integer")
        if not isinstance(self.separator, str) or not self.separator:
            self._invalid("separator", "a non-empty string")
        if not _is_number(self.fill_value) or not abs(float(self.fill_value)) <= FLOAT32_MAX:
            self._invalid("fill_value", "a finite number a float32 can hold")
        missing = self.missing_value
        if missing is not None and not (_is_number(missing) or (isinstance(missing, str) and self.is_sparse)):
            self._invalid("missing_value", "a string or a number" if self.is_sparse else "a number")
        if self.is_sparse and self.embedding_dim <= 0:
            raise SchemaError(f"feature {self.name!r}: embedding_dim must be > 0")
        if self.min_count < 1:
            raise SchemaError(f"feature {self.name!r}: min_count must be >= 1")
        if self.hash_size is not None and self.hash_size < 1:
            raise SchemaError(f"feature {self.name!r}: hash_size must be >= 1")
        if self.is_vector:
            if self.dim is None or self.dim < 1:
                raise SchemaError(f"feature {self.name!r}: a vector feature needs its width, dim >= 1; got {self.dim!r}")
            if self.transform not in (DenseTransform.NONE, DenseTransform.STANDARDIZE):
                self._invalid("transform", "'none' or 'standardize' for a vector feature")
            if self.prefix is not None and (not isinstance(self.prefix, str) or not self.prefix):
                self._invalid("prefix", "a non-empty string")
        else:
            for key in ("dim", "prefix"):
                if getattr(self, key) is not None:
                    raise SchemaError(f"feature {self.name!r}: {key} is for vector features only (kind {self.kind.value!r})")

    def _invalid(self, key: str, what: str) -> None:
        raise SchemaError(f"feature {self.name!r}: {key} must be {what}, got {getattr(self, key)!r}")

    @property
    def is_sparse(self) -> bool:
        """An id feature (categorical or multi-categorical): it has an embedding table."""
        return self.kind in (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL)

    @property
    def is_vector(self) -> bool:
        return self.kind is FeatureKind.VECTOR

    @property
    def width(self) -> int:
        """Input dimensions at the seam: the embedding dim of an id feature, 1 for a dense
        scalar, D for a vector."""
        if self.is_sparse:
            return int(self.embedding_dim)
        return int(self.dim or 1) if self.is_vector else 1

    @property
    def columns(self) -> tuple[str, ...]:
        """The raw columns that hold this feature: its name, or a vector's D prefixed columns."""
        if not self.is_vector:
            return (self.name,)
        prefix = self.prefix if self.prefix is not None else f"{self.name}_"
        return tuple(f"{prefix}{i}" for i in range(int(self.dim or 0)))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = self.kind.value
        out["transform"] = self.transform.value
        for key in ("dim", "prefix"):  # vector options: written only where set, as before vectors existed
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureSpec:
        if not isinstance(data, Mapping):
            raise SchemaError(f"a feature must be a name or a mapping of its options, got {data!r}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise SchemaError(
                f"feature {data.get('name')!r}: unknown keys {sorted(unknown, key=str)}; "
                f"allowed: {sorted(cls.__dataclass_fields__)}"
            )
        return cls(**dict(data))


@dataclass(frozen=True)
class Schema:
    """Ordered features plus the label column.

    Sparse features keep their order (it is the KJT key order and the seam order); dense
    features (scalars and vectors) keep theirs: the dense tensor holds their columns in that
    order, one column for a scalar and D for a vector (:attr:`dense_widths`).
    """

    features: tuple[FeatureSpec, ...]
    label: str = "label"
    name: str = "dataset"
    extras: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(self.features))
        if not isinstance(self.label, str) or not self.label:
            raise SchemaError(f"label must be a non-empty string (the label column's name), got {self.label!r}")
        names = [f.name for f in self.features]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SchemaError(f"duplicate feature names: {dupes}")
        if self.label in names:
            raise SchemaError(f"label column {self.label!r} is also listed as a feature")
        if not self.features:
            raise SchemaError("a schema needs at least one feature")
        columns = [c for f in self.features for c in f.columns]
        if len(set(columns)) != len(columns):
            clash = sorted({c for c in columns if columns.count(c) > 1})
            raise SchemaError(f"raw columns {clash[:10]} are named by more than one feature (a vector's prefix "
                              "columns clash with another feature): rename one or set the vector's prefix")
        if self.label in set(columns):
            raise SchemaError(f"label column {self.label!r} is also a column of a vector feature")

    # -- views (computed once: a schema of thousands of features is read in loops) ---------------
    @cached_property
    def _views(self) -> dict[str, Any]:
        sparse = tuple(f for f in self.features if f.is_sparse)
        dense = tuple(f for f in self.features if not f.is_sparse)
        return {
            "sparse": sparse,
            "dense": dense,
            "names": tuple(f.name for f in self.features),
            "sparse_names": tuple(f.name for f in sparse),
            "dense_names": tuple(f.name for f in dense),
            "dense_widths": tuple(f.width for f in dense),
            "dense_columns": tuple(c for f in dense for c in f.columns),
            "columns": tuple(c for f in self.features for c in f.columns),
            "index": {f.name: f for f in self.features},
        }

    @property
    def sparse(self) -> tuple[FeatureSpec, ...]:
        return self._views["sparse"]

    @property
    def dense(self) -> tuple[FeatureSpec, ...]:
        """The dense features: scalars and vectors, in schema order."""
        return self._views["dense"]

    @property
    def sparse_names(self) -> list[str]:
        return list(self._views["sparse_names"])

    @property
    def dense_names(self) -> list[str]:
        return list(self._views["dense_names"])

    @property
    def names(self) -> list[str]:
        return list(self._views["names"])

    @property
    def dense_widths(self) -> list[int]:
        """Columns each dense feature takes in the dense tensor (1 for a scalar, D for a vector)."""
        return list(self._views["dense_widths"])

    @property
    def dense_width(self) -> int:
        """Columns of the dense tensor, D_dense."""
        return sum(self._views["dense_widths"])

    @property
    def dense_columns(self) -> list[str]:
        """The raw columns of the dense features, in the dense tensor's column order."""
        return list(self._views["dense_columns"])

    @property
    def columns(self) -> list[str]:
        """Every raw column the features read (a vector's D columns), schema order."""
        return list(self._views["columns"])

    @property
    def vectors(self) -> tuple[FeatureSpec, ...]:
        return tuple(f for f in self.features if f.is_vector)

    @property
    def dimensions(self) -> int:
        """Input dimensions of the model at the seam: Σ of every feature's :attr:`FeatureSpec.width`."""
        return sum(f.width for f in self.features)

    def __getitem__(self, name: str) -> FeatureSpec:
        spec = self._views["index"].get(name)
        if spec is None:
            raise SchemaError(f"unknown feature {name!r}; available: {self.names}")
        return spec

    def __len__(self) -> int:
        return len(self.features)

    # -- derived schemas -----------------------------------------------------------------
    def select(self, names: Iterable[str]) -> Schema:
        """The schema restricted to ``names`` (kept in this schema's order)."""
        wanted = list(names)
        self.check_columns(wanted, what="selected features")
        keep = set(wanted)
        return replace(self, features=tuple(f for f in self.features if f.name in keep))

    def drop(self, names: Iterable[str]) -> Schema:
        names = list(names)
        self.check_columns(names, what="dropped features")
        gone = set(names)
        return replace(self, features=tuple(f for f in self.features if f.name not in gone))

    def view(
        self, features: list[str] | None = None, drop_features: list[str] | None = None, embedding_dim: int | None = None
    ) -> Schema:
        """The schema of a data config's feature options: only ``features`` (this schema's
        order), without ``drop_features``, every sparse embedding ``embedding_dim`` wide.
        Unknown names raise a ``SchemaError`` naming the option."""
        schema = self
        if features:
            schema = schema.select(features)
        if drop_features:
            schema.check_columns(drop_features, what="drop_features")
            schema = schema.drop(drop_features)
        if embedding_dim is not None:
            schema = schema.with_uniform_dim(embedding_dim)
        return schema

    def with_dims(self, dims: Mapping[str, int]) -> Schema:
        """A copy with per-feature embedding dims replaced."""
        self.check_columns(dims, what="embedding dims")
        return replace(
            self,
            features=tuple(
                replace(f, embedding_dim=int(dims[f.name])) if f.name in dims else f
                for f in self.features
            ),
        )

    def with_uniform_dim(self, dim: int) -> Schema:
        return self.with_dims({f.name: dim for f in self.sparse})

    def check_columns(self, names: Iterable[str], what: str = "features") -> None:
        known = self._views["index"]
        missing = [n for n in names if n not in known]
        if missing:
            raise SchemaError(f"{what} {missing} are not in the data; available columns: {self.names}")

    @property
    def is_fitted(self) -> bool:
        return all(f.num_embeddings is not None for f in self.sparse)

    # -- files -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "features": [f.to_dict() for f in self.features],
            **({"extras": self.extras} if self.extras else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "schema") -> Schema:
        if "features" not in data:
            raise SchemaError(f"{source}: missing key 'features'")
        unknown = set(data) - {"name", "label", "features", "extras"}
        if unknown:  # a typo such as 'lable' must not silently fall back to the default
            raise SchemaError(
                f"{source}: unknown keys {sorted(unknown, key=str)}; allowed: ['extras', 'features', 'label', 'name']"
            )
        if not isinstance(data["features"], list):
            raise SchemaError(f"{source}: 'features' must be a list of features, got {data['features']!r}")
        if not isinstance(data.get("extras", {}), Mapping):
            raise SchemaError(f"{source}: 'extras' must be a mapping, got {data['extras']!r}")
        feats = []
        for i, raw in enumerate(data["features"]):
            if isinstance(raw, str):
                raw = {"name": raw}
            try:
                feats.append(FeatureSpec.from_dict(raw))
            except (TypeError, ValueError) as e:
                raise SchemaError(f"{source}: features[{i}]: {e}") from e
        try:
            return cls(
                features=tuple(feats),
                label=data.get("label", "label"),
                name=data.get("name", "dataset"),
                extras=dict(data.get("extras", {})),
            )
        except SchemaError as e:
            raise SchemaError(f"{source}: {e}") from e

    def save(self, path: str | Path) -> None:
        """Write the schema atomically: YAML for ``.yaml``/``.yml``, JSON otherwise."""
        from recsys.artifacts import write_artifact

        write_artifact(path, self.to_dict(), allow_nan=True)  # extras are the user's: NaN passes, as before

    @classmethod
    def load(cls, path: str | Path) -> Schema:
        """Read a :meth:`save` file (or a hand-written one); a bad file raises :class:`SchemaError`
        naming it, a missing one ``FileNotFoundError``."""
        from recsys.artifacts import read_artifact

        return cls.from_dict(read_artifact(path, "schema file", SchemaError), source=str(Path(path)))
