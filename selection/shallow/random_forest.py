"""Random-forest importance: a forest on the encoded training rows, ranked by impurity
(ERASE's random-forest baseline; Breiman 2001; methods.md §7.4).

scikit-learn's ``RandomForestClassifier`` on one column per field (a sparse field's id, a dense
field's value); a field's score is its mean decrease in impurity over the trees.

    report = RandomForestImportance().rank(recipe)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from selection.shallow.tabular import FieldTable, ShallowMethod

__all__ = ["RandomForestImportance"]


@dataclass
class RandomForestImportance(ShallowMethod):
    """Random forest (scikit-learn).

    Args:
        n_estimators: trees.
        min_samples_leaf: rows per leaf at least (larger: shallower trees that memorise less
            of the high-cardinality ids).
        max_rows, seed, leakage_threshold: see :class:`~selection.shallow.tabular.ShallowMethod`.
    """

    name: ClassVar[str] = "random_forest"
    max_rows: int = 100_000
    n_estimators: int = 100
    min_samples_leaf: int = 20

    def fit_scores(self, train: FieldTable, val: FieldTable | None) -> tuple[dict[str, float], Any]:
        from sklearn.ensemble import RandomForestClassifier

        model = RandomForestClassifier(n_estimators=self.n_estimators, min_samples_leaf=self.min_samples_leaf,
                                       max_features="sqrt", random_state=self.seed, n_jobs=1)
        model.fit(train.codes, train.labels)
        return train.per_feature(model.feature_importances_), model

    def predict(self, model: Any, table: FieldTable) -> np.ndarray:
        return np.asarray(model.predict_proba(table.codes)[:, -1])
