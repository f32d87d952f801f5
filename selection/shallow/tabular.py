"""The encoded rows as a table, and the base of the shallow selectors that rank on it.

ERASE's shallow baselines (Lasso, GBDT, random forest, XGBoost; methods.md §7.4) rank fields by
a classic model fitted on the encoded training rows, no deep model involved. They share what
:class:`ShallowMethod` does: a seeded sample of at most ``max_rows`` encoded training rows
(read shard by shard when the data module streams), the leakage screen of the model-based
methods, the model's AUC on a sample of the validation rows (reported, never used to rank),
and one report. Subclasses implement :meth:`ShallowMethod.field_scores`.

Two views of the rows (:class:`FieldTable`):

* ``codes``: one column per feature (N x C float32; a vector feature takes its D columns,
  ``owner`` maps a column to its feature): a sparse feature's id (ids are ordered by training
  frequency, 0 is OOV or an empty bag; a multi-hot bag gives its first id), a dense feature's
  encoded value. Trees split on it; a feature's importance sums its columns'
  (:meth:`FieldTable.per_feature`).
* :meth:`FieldTable.one_hot`: a sparse indicator matrix (one column per id of each sparse
  feature, every id of a bag) next to the standardised dense columns, the linear view.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from recsys.data.encoders import EncodedData
from recsys.data.schema import Schema
from recsys.metrics import binary_auc
from recsys.train.recipe import Recipe
from selection.base import ImportanceMethod, method_report, screen_leakage
from selection.report import ImportanceReport

__all__ = ["FieldTable", "ShallowMethod", "field_table"]


@dataclass
class FieldTable:
    """Encoded rows of the features ``names`` (schema order) as model inputs.

    Attributes:
        names: the features.
        sparse: whether each feature is sparse (ids) rather than dense.
        cardinality: rows of each sparse feature's table (``num_embeddings``; 0 for dense).
        codes: N x C float32 (see the module docstring).
        labels: N int64 (0/1).
        data: the encoded rows (for :meth:`one_hot`).
        owner: the feature (index into ``names``) of each column of ``codes`` (None: one each).
    """

    names: list[str]
    sparse: list[bool]
    cardinality: list[int]
    codes: np.ndarray
    labels: np.ndarray
    data: EncodedData
    owner: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def column_owner(self) -> np.ndarray:
        """The feature index of every column of ``codes``."""
        return self.owner if self.owner is not None else np.arange(len(self.names))

    def per_feature(self, column_values: np.ndarray) -> dict[str, float]:
        """Per-column values (a model's importances over ``codes``) summed per feature."""
        sums = np.bincount(self.column_owner, weights=np.asarray(column_values, dtype=np.float64), minlength=len(self.names))
        return dict(zip(self.names, map(float, sums)))

    def one_hot(self, max_ids: int, dense_stats: dict[str, tuple[float, float]] | None = None) -> tuple[Any, np.ndarray]:
        """``(X, owner)``: a CSR matrix with one indicator column per id (ids at or past
        ``max_ids`` share the OOV column of their feature) and one standardised column per dense
        feature, and the feature index of every column.

        ``dense_stats``: ``name -> (mean, std)`` to standardise with (default: this table's),
        so that a validation table reads the training table's scale.
        """
        from scipy import sparse as sp

        n = len(self)
        blocks, owner = [], []
        for j, name in enumerate(self.names):
            if self.sparse[j]:
                lengths = self.data.lengths[name].astype(np.int64)
                ids = self.data.values[name].astype(np.int64)
                width = min(self.cardinality[j], max_ids)
                ids = np.where(ids < width, ids, 0)
                rows = np.repeat(np.arange(n), lengths)
                block = sp.csr_matrix((np.ones(len(ids), np.float32), (rows, ids)), shape=(n, width))
                block.sum_duplicates()
                block.data[:] = 1.0  # an id repeated in a bag counts once
            else:
                x = self.codes[:, self.column_owner == j].astype(np.float64)
                mean, std = (dense_stats or {}).get(name, (float(x.mean()) if n else 0.0, float(x.std()) if n else 1.0))
                block = sp.csr_matrix(((x - mean) / (std if std > 0 else 1.0)).astype(np.float32))
                width = x.shape[1]
            blocks.append(block)
            owner.extend([j] * width)
        return sp.hstack(blocks, format="csr"), np.asarray(owner, dtype=np.int64)

    def dense_stats(self) -> dict[str, tuple[float, float]]:
        """``name -> (mean, std)`` of each dense feature (over a vector's columns together: what
        :meth:`one_hot` standardises by)."""
        owner = self.column_owner
        return {n: (float(self.codes[:, owner == j].mean()), float(self.codes[:, owner == j].std()))
                for j, n in enumerate(self.names) if not self.sparse[j] and len(self)}


def field_table(data: EncodedData, schema: Schema) -> FieldTable:
    """The :class:`FieldTable` of encoded rows ``data`` over the features of ``schema``."""
    n = len(data)
    names: list[str] = []
    sparse: list[bool] = []
    card: list[int] = []
    cols: list[np.ndarray] = []
    owner: list[int] = []
    dense_index = data.dense_slices()
    for j, spec in enumerate(schema.features):
        if not spec.is_sparse:
            block = data.dense[:, dense_index[spec.name]].astype(np.float32)
            cols.extend(block.T)
            owner.extend([j] * block.shape[1])
            card.append(0)
        else:
            lengths = data.lengths[spec.name].astype(np.int64)
            starts = np.cumsum(lengths) - lengths
            values = data.values[spec.name]
            first = np.zeros(n, dtype=np.float32)
            has = lengths > 0
            first[has] = values[starts[has]]
            cols.append(first)
            owner.append(j)
            card.append(int(spec.num_embeddings or (int(values.max()) + 1 if len(values) else 1)))
        names.append(spec.name)
        sparse.append(spec.is_sparse)
    codes = np.stack(cols, axis=1) if cols else np.zeros((n, 0), np.float32)
    return FieldTable(names, sparse, card, codes, data.labels.astype(np.int64), data, np.asarray(owner, dtype=np.int64))


@dataclass
class ShallowMethod(ImportanceMethod):
    """Base of the selectors that fit a classic model on the encoded training rows.

    Args:
        max_rows: training rows sampled (seeded, uniform; every row when the split has no more;
            fewer at width, where the model's input would pass ``max_bytes``, 2 GB).
        seed: seed of the row sample and of the model.
        leakage_threshold: as in the model-based methods (0 turns the screen off).
        id_screen: rank ID-like features with no signal beyond chance on the training rows
            after all the others (:func:`~selection.base.screen_memorisable`).
        max_seconds: refuse at once a fit estimated past this (half an hour; None: never), for
            the models whose cost grows fast with the width (:meth:`estimated_seconds`).
    """

    max_rows: int = 200_000
    seed: int = 0
    leakage_threshold: float = 0.9
    id_screen: bool = True
    max_seconds: float | None = 1800.0

    def __post_init__(self) -> None:
        if self.max_rows < 1:
            raise ValueError(f"{type(self).__name__}.max_rows must be >= 1, got {self.max_rows}")

    #: bytes the model's input may take: the row sample shrinks below ``max_rows`` at width
    max_bytes: ClassVar[int] = 2 << 30

    def row_bytes(self, schema: Schema) -> int:
        """Bytes one sampled row takes as the model's input (the codes: 4 per column)."""
        return 4 * (len(schema.sparse) + schema.dense_width)

    def sample_size(self, schema: Schema) -> int:
        """Rows sampled: ``max_rows``, or fewer where their input would pass :attr:`max_bytes`."""
        return max(1000, min(self.max_rows, self.max_bytes // max(self.row_bytes(schema), 1)))

    def estimated_seconds(self, rows: int, columns: int) -> float | None:
        """The fit's time on ``rows`` x ``columns`` codes, where it grows fast enough with the
        width to be refused (None: no estimate, never refused)."""
        return None

    def check_cost(self, rows: int, columns: int) -> None:
        """Refuse at once (:class:`~selection.base.WidthRefusal`) a fit estimated past ``max_seconds``."""
        from selection.base import WidthRefusal

        seconds = self.estimated_seconds(rows, columns)
        if seconds is not None and self.max_seconds is not None and seconds > self.max_seconds:
            raise WidthRefusal(
                f"{self.name}: fitting {rows:,} rows x {columns:,} columns would take about {seconds / 60:,.0f} min "
                f"(> max_seconds={self.max_seconds:g}); use lightgbm (histogram trees), fewer rows (max_rows) or "
                "fewer features, or raise max_seconds")

    @abstractmethod
    def fit_scores(self, train: FieldTable, val: FieldTable | None) -> tuple[dict[str, float], Any]:
        """Fit the model on ``train`` (``val``: held-out rows for early stopping, or None) and
        return ``(score of every feature of train, the fitted model)``."""

    @abstractmethod
    def predict(self, model: Any, table: FieldTable) -> np.ndarray:
        """Scores (N,) of the fitted ``model`` on ``table`` (for the reported validation AUC)."""

    def rank(self, recipe: Recipe) -> ImportanceReport:
        start = time.perf_counter()
        leaks = screen_leakage(recipe, self.leakage_threshold) if self.leakage_threshold > 0 else {}
        dm = recipe.datamodule
        schema = recipe.schema
        kept = schema.view(drop_features=sorted(leaks)) if leaks else schema
        rows = self.sample_size(kept)
        train = field_table(dm.sample_rows("train", rows, seed=self.seed), kept)
        self.check_cost(len(train), train.codes.shape[1])
        val = field_table(dm.sample_rows("val", rows, seed=self.seed), kept) if dm.has_split("val") else None
        scores, model = self.fit_scores(train, val)
        val_auc = binary_auc(self.predict(model, val), val.labels) if val is not None and len(np.unique(val.labels)) == 2 else None
        return method_report(self, recipe, scores, start,
                             {f: f"{reason} (fitted without it)" for f, reason in leaks.items()},
                             {"train_rows": len(train), "val_rows": len(val) if val is not None else 0, "val_auc": val_auc},
                             id_screen=self.id_screen)
