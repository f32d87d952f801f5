"""LightGBM importance: boosted trees with native categorical splits on the encoded training
rows, ranked by total gain (ERASE's XGBoost baseline, with LightGBM; Ke et al. 2017;
methods.md §7.4).

Sparse single-valued fields are LightGBM categoricals (their ids), dense fields numeric; the
number of trees is chosen by early stopping on a sample of the validation rows. A field's score
is the total loss reduction of its splits (``importance_type="gain"``), normalised to sum to 1.

    report = LightGBMImportance().rank(recipe)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from selection.shallow.tabular import FieldTable, ShallowMethod

__all__ = ["LightGBMImportance"]


@dataclass
class LightGBMImportance(ShallowMethod):
    """Gradient-boosted trees (LightGBM, deterministic, one thread).

    Args:
        n_estimators: the most trees (early stopping on validation keeps fewer).
        num_leaves: leaves per tree.
        learning_rate: shrinkage.
        min_data_per_group: rows a category needs to get its own branch (larger: fewer splits
            on rare ids, which a tree can only memorise).
        max_rows, seed, leakage_threshold: see :class:`~selection.shallow.tabular.ShallowMethod`.
    """

    name: ClassVar[str] = "lightgbm"
    n_estimators: int = 300
    num_leaves: int = 31
    learning_rate: float = 0.1
    min_data_per_group: int = 100

    def fit_scores(self, train: FieldTable, val: FieldTable | None) -> tuple[dict[str, float], Any]:
        import lightgbm as lgb

        single = [s and not multi for s, multi in zip(train.sparse, self._multi(train))]
        categorical = [c for c, j in enumerate(train.column_owner) if single[j]]  # columns of single-id features
        model = lgb.LGBMClassifier(
            n_estimators=self.n_estimators, num_leaves=self.num_leaves, learning_rate=self.learning_rate,
            min_data_per_group=self.min_data_per_group, importance_type="gain", random_state=self.seed,
            deterministic=True, force_row_wise=True, n_jobs=1, verbose=-1,
        )
        fit: dict[str, Any] = {"categorical_feature": categorical}
        if val is not None and len(np.unique(val.labels)) == 2:
            fit.update(eval_set=[(val.codes, val.labels)], callbacks=[lgb.early_stopping(20, verbose=False)])
        model.fit(train.codes, train.labels, **fit)
        gain = np.asarray(model.booster_.feature_importance(importance_type="gain"), dtype=np.float64)
        total = gain.sum()
        return train.per_feature(gain / total if total > 0 else gain), model

    @staticmethod
    def _multi(table: FieldTable) -> list[bool]:
        return [bool(s and (table.data.lengths[n] != 1).any()) for n, s in zip(table.names, table.sparse)]

    def predict(self, model: Any, table: FieldTable) -> np.ndarray:
        return np.asarray(model.booster_.predict(table.codes, raw_score=True))
