"""How LeAP's final ranking combines its gates with the other scores its run yields for free.

Three scores per field come out of one LeAP run, each on its own scale:

* the final gate ``s_f`` (on [0, 1]): how much of the field the model defends against the penalty;
* OutRank's chance-corrected relevance on the training rows (the leakage screen computes it
  anyway): what the rows carry, judged one feature at a time;
* [INF] the held-out drop: the validation AUC the LeAP-trained model loses when the field is
  replaced by a batch-shuffled replica. The model trained on exactly these replicas, so the drop
  is a clean drop-field estimate (no retraining, no out-of-distribution inputs), and being
  measured on validation rows it rewards what generalises, not what the model memorised.

    fuse(gates, relevance, LeAPFusion.RELEVANCE_HELDOUT, heldout=drops)  # LeAP's default

[INF] The default (``auto``) depends on the width. Up to LeAP's ``heldout_fields`` (64) fields it
sums the two scores judged on rows (relevance on training rows, the drop on validation rows) and
leaves the gates to break ties: on Criteo head-10k, MovieLens and Frappe it has the highest
validation AUKC of the fusions (issue 17 note); the gates earn the drops their meaning, since the
model trained on exactly the replicas it is scored with. Beyond that it is ``sum`` (gate +
relevance): a drop per field would cost an evaluation pass per field, a field's drop among
thousands is small and noisy, and a rare scalar the gates keep but whose relevance is small
would be ranked by its relevance; on the wide benchmark's planted truth at F = 1,000 (4 epochs)
``sum`` recalls 0.91 of the signal against 0.82 for ``relevance_heldout`` on the top 64
(``experiments/results/wide.md``).
"""

from __future__ import annotations

from enum import Enum, unique

__all__ = [
    "LeAPFusion", "borda_fusion", "combsum", "fuse", "heldout_fusion", "product_fusion", "ranks_by", "sum_fusion",
]


@unique
class LeAPFusion(str, Enum):
    """What the final ranking reads besides the gates (see the module docstring)."""

    AUTO = "auto"  # relevance_heldout up to LeAP.heldout_fields fields, sum beyond (LeAP's default)
    NONE = "none"  # the final gates alone
    PRODUCT = "product"  # gate x relevance rank: s_f * (1 - r_rel(f) / F)
    BORDA = "borda"  # the mean of the two ranks
    SUM = "sum"  # gate + relevance / the largest relevance (CombSUM of two scores on [0, 1])
    HELDOUT = "heldout"  # gate + relevance + held-out drop, each on [0, 1]
    RELEVANCE_HELDOUT = "relevance_heldout"  # relevance + held-out drop, each on [0, 1] (the gates break ties)
    DROP = "drop"  # the held-out drops alone (the gates break ties)

    @property
    def reads_heldout(self) -> bool:
        """Whether this fusion needs the held-out drops."""
        return self in (LeAPFusion.HELDOUT, LeAPFusion.RELEVANCE_HELDOUT, LeAPFusion.DROP)


def ranks_by(fields: list[str], scores: dict[str, float]) -> dict[str, int]:
    """0-based rank of each field by ``scores`` (largest first; missing fields count as 0,
    ties keep ``fields``' order)."""
    return {f: i for i, f in enumerate(sorted(fields, key=lambda f: -scores.get(f, 0.0)))}


def borda_fusion(gates: dict[str, float], relevance: dict[str, float]) -> dict[str, float]:
    """Borda count of two rankings: ``score_f = (F − 1) − (r_gate + r_rel) / 2 − r_gate / (4F)``,
    ``r`` the 0-based rank (largest score first); equal sums are ordered by the gate (the last
    term, below the sum's 0.5 step). Fields missing from ``relevance`` count as relevance 0."""
    n = len(gates)
    by_gate = ranks_by(list(gates), gates)
    by_relevance = ranks_by(sorted(gates, key=lambda f: by_gate[f]), relevance)
    return {f: (n - 1) - (by_gate[f] + by_relevance[f]) / 2 - by_gate[f] / (4 * n) for f in gates}


def product_fusion(gates: dict[str, float], relevance: dict[str, float]) -> dict[str, float]:
    """Each gate times its field's relevance-rank weight: ``s_f · (1 − r_rel(f) / F)`` (the most
    relevant field keeps its gate, the least keeps 1/F of it)."""
    n = len(gates)
    ranks = ranks_by(list(gates), relevance)
    return {f: gates[f] * (1 - ranks[f] / n) for f in gates}


def _unit(fields: dict[str, float], scores: dict[str, float]) -> dict[str, float]:
    """``max(x_f, 0) / max_g x_g`` for every field of ``fields`` (missing: 0; all 0 if none is positive)."""
    top = max((max(scores.get(f, 0.0), 0.0) for f in fields), default=0.0)
    return {f: max(scores.get(f, 0.0), 0.0) / top if top > 0 else 0.0 for f in fields}


def combsum(gates: dict[str, float], *scores: dict[str, float], gate_weight: float = 1.0) -> dict[str, float]:
    """CombSUM over the fields of ``gates``: ``gate_weight · s_f + Σ_j max(x_jf, 0) / max_g x_jg``
    (each partner score rescaled to [0, 1]; negative or missing scores count as 0)."""
    units = [_unit(gates, x) for x in scores]
    return {f: gate_weight * gates[f] + sum(u[f] for u in units) for f in gates}


def sum_fusion(gates: dict[str, float], relevance: dict[str, float]) -> dict[str, float]:
    """CombSUM of the two scores, each on [0, 1]: ``s_f + max(rel_f, 0) / max_g rel_g``.

    Unlike the rank-based fusions it reads how far apart two relevances are: a field whose
    chance-corrected relevance is about 0 (a high-cardinality id whose signal only shows with
    the others, or is cancelled by the correction) keeps its gate instead of the last rank's
    weight, and near-equal relevances barely move the gates' order."""
    return combsum(gates, relevance)


def heldout_fusion(gates: dict[str, float], relevance: dict[str, float], heldout: dict[str, float]) -> dict[str, float]:
    """CombSUM of three scores on [0, 1]: ``s_f + rel_f / max rel + drop_f / max drop``
    (negative relevances and drops count as 0). The held-out drop demotes a field the model
    leans on during training but that does not carry over to validation rows (memorised ids),
    and promotes one whose gate saturated early but whose loss the model cannot absorb."""
    return combsum(gates, relevance, heldout)


def fuse(
    gates: dict[str, float], relevance: dict[str, float], fusion: LeAPFusion | str,
    heldout: dict[str, float] | None = None,
) -> dict[str, float]:
    """The final scores of ``gates`` under ``fusion`` (``heldout``: feature -> held-out AUC drop,
    needed by the fusions whose :attr:`~LeAPFusion.reads_heldout` is true)."""
    fusion = LeAPFusion(fusion)
    if fusion is LeAPFusion.AUTO:  # what LeAP resolved it to: the drops were measured or not
        fusion = LeAPFusion.RELEVANCE_HELDOUT if heldout is not None else LeAPFusion.SUM
    if fusion.reads_heldout and heldout is None:
        raise ValueError(f"fusion {fusion.value!r} needs the held-out drops (LeAP(heldout_rows > 0))")
    if fusion is LeAPFusion.HELDOUT:
        return heldout_fusion(gates, relevance, heldout or {})
    if fusion is LeAPFusion.RELEVANCE_HELDOUT:
        return combsum(gates, relevance, heldout or {}, gate_weight=1e-3)  # the gates only break ties
    if fusion is LeAPFusion.DROP:
        return combsum(gates, heldout or {}, gate_weight=1e-3)
    if fusion is LeAPFusion.SUM:
        return sum_fusion(gates, relevance)
    if fusion is LeAPFusion.PRODUCT:
        return product_fusion(gates, relevance)
    if fusion is LeAPFusion.BORDA:
        return borda_fusion(gates, relevance)
    return dict(gates)
