"""One-shot ranking metrics shared by every package.

:func:`binary_auc` is the project's single implementation of a whole-split ROC AUC (the
permutation importance drops, the synthetic data's oracle AUC, ...). The trainer's per-epoch
``val_auc``/``test_auc`` stay torchmetrics' streaming ``BinaryAUROC`` (synchronised across
processes); both define AUC the same way, ties counting one half, and
``tests/recsys/test_metrics.py`` checks that they agree.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["binary_auc"]


def _as_tensor(x: torch.Tensor | npt.ArrayLike, dtype: npt.DTypeLike | None) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().reshape(-1).cpu()
    a = np.asarray(x, dtype=dtype).reshape(-1)
    if not a.flags.writeable:  # torch warns about (and refuses to share) read-only arrays
        a = a.copy()
    return torch.from_numpy(a)


def binary_auc(scores: torch.Tensor | npt.ArrayLike, labels: torch.Tensor | npt.ArrayLike) -> float:
    """ROC AUC by the Mann-Whitney rank-sum formula, ties averaged, in float64.

    ``AUC = (sum of the positives' ranks - n1 (n1 + 1) / 2) / (n1 n0)`` with 1-based ranks of
    the scores, tied scores sharing the average rank of their run: the probability that a random
    positive scores above a random negative, a tie counting one half. Equals
    ``sklearn.metrics.roc_auc_score(labels, scores)``.

    Args:
        scores: ``N`` scores (any shape, flattened; logits and probabilities give the same AUC),
            a torch tensor on any device or anything ``numpy.asarray`` takes.
        labels: ``N`` labels, same element count; positive means ``> 0.5`` (0/1 ints, floats
            or bools).

    Returns:
        The AUC in ``[0, 1]``; NaN when a class is missing or a score is NaN.

    Example::

        >>> binary_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
        0.75
    """
    s = _as_tensor(scores, np.float64).double()
    y = _as_tensor(labels, None) > 0.5
    if s.numel() != y.numel():
        raise ValueError(f"binary_auc: {s.numel()} scores but {y.numel()} labels")
    n1 = int(y.sum())
    n0 = int(y.numel()) - n1
    if n1 == 0 or n0 == 0 or bool(torch.isnan(s).any()):
        return float("nan")
    order = torch.argsort(s)
    # average 1-based rank of every run of equal scores (half-integers: exact in float64)
    _, inverse, counts = torch.unique_consecutive(s[order], return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    avg = ends - (counts.double() - 1.0) / 2.0
    ranks = torch.empty_like(s)
    ranks[order] = avg[inverse]
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))
