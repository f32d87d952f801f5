"""Lasso importance: an L1-penalised logistic regression on the one-hot encoded training rows
(ERASE's Lasso baseline; Tibshirani 1996; methods.md §7.4).

Each field's score is the spread of its contribution to the logit over the training rows,
``std_rows(x_f,row · w_f)`` (for a dense field ``|w_f| · std(x_f)``): how far the field moves
the prediction, not how many coefficients it owns, so a field with thousands of ids is not
favoured for its width ([INF]: ERASE sums absolute coefficients, which grows with a field's
cardinality). A field whose coefficients the L1 penalty zeroes scores 0.

    report = LassoImportance(C=0.1).rank(recipe)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from recsys.data.schema import Schema
from selection.shallow.tabular import FieldTable, ShallowMethod

__all__ = ["LassoImportance"]


@dataclass
class LassoImportance(ShallowMethod):
    """L1 logistic regression (liblinear) on one-hot ids and standardised dense columns.

    Args:
        C: inverse L1 strength (smaller: fewer non-zero coefficients).
        max_ids: one-hot columns per sparse feature (the most frequent ids; rarer ones share the
            OOV column).
        max_rows, seed, leakage_threshold: see :class:`~selection.shallow.tabular.ShallowMethod`.
    """

    name: ClassVar[str] = "lasso"
    C: float = 0.1
    max_ids: int = 10_000

    def row_bytes(self, schema: Schema) -> int:
        """The one-hot matrix's row: 12 bytes per non-zero (CSR value and index), every dense column one."""
        return 12 * (len(schema.sparse) + schema.dense_width) + super().row_bytes(schema)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.C <= 0 or self.max_ids < 1:
            raise ValueError(f"LassoImportance needs C > 0 and max_ids >= 1, got C={self.C}, max_ids={self.max_ids}")

    def fit_scores(self, train: FieldTable, val: FieldTable | None) -> tuple[dict[str, float], Any]:
        from sklearn.linear_model import LogisticRegression

        x, owner = train.one_hot(self.max_ids)
        model = LogisticRegression(l1_ratio=1.0, C=self.C, solver="liblinear", random_state=self.seed, max_iter=200)
        model.fit(x, train.labels)
        scores = dict(zip(train.names, map(float, _share_std(x, model.coef_.ravel(), owner, len(train.names)))))
        return scores, (model, train.dense_stats())

    def predict(self, model: Any, table: FieldTable) -> np.ndarray:
        fitted, stats = model
        x, _ = table.one_hot(self.max_ids, stats)
        return np.asarray(fitted.decision_function(x))


def _share_std(x: Any, w: np.ndarray, owner: np.ndarray, features: int, rows: int = 4096) -> np.ndarray:
    """The std over rows of every feature's share of the logit, ``x[:, cols_f] @ w[cols_f]``
    (F), in chunks of ``rows`` rows: one sparse product per chunk, at any number of features."""
    from scipy import sparse as sp

    assign = sp.csr_matrix((w.astype(np.float64), (np.arange(len(owner)), owner)), shape=(len(owner), features))
    total = np.zeros(features)
    squares = np.zeros(features)
    n = x.shape[0]
    for start in range(0, n, rows):
        part = np.asarray((x[start : start + rows] @ assign).todense())  # rows x F: each feature's share
        total += part.sum(axis=0)
        squares += (part * part).sum(axis=0)
    mean = total / max(n, 1)
    return np.sqrt(np.maximum(squares / max(n, 1) - mean * mean, 0.0))
