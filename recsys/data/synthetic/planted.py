"""Synthetic CTR data with planted ground truth: the embedded default dataset.

Every feature has a known role (:class:`FeatureRole`) and the label is drawn from a known
logit, so feature selection (OutRank, permutation importance, LeAP) and embedding-dimension
search can be checked against the truth::

    raw, truth = generate(SyntheticConfig(n_rows=100_000, seed=0))
    truth.importance_order()            # signal features, strongest planted effect first
    truth.names(FeatureRole.NOISE)      # what a selector should drop
    truth.true_probability(raw.frame)   # Bayes-optimal click probability of every row
    GroundTruth.from_raw(raw)           # the same truth, read back from the schema extras

The logit is ``bias + sum of per-term contributions``. Each term has a planted *strength*,
the (population) standard deviation of its contribution, so importance is ordered by design:

* informative categoricals: a random effect per category, centred and scaled under the
  category frequencies;
* ``tags`` (multi-hot): the sum of its tokens' random effects (std ~0.57 for a planted 0.6);
* dense: log-linear (``price``), linear (``relevance_score``) or U-shaped quadratic
  (``engagement_score``) in the *visible* value: a NaN cell counts as the feature's
  ``fill_value``, which is what the encoders feed the model, so the truth is a function of
  the features alone;
* ``promo_flag``: ``"0"`` in 99% of rows, a large positive effect in the other 1%;
* ``ad_slot`` x ``daypart``: a Latin-square interaction (every slot sees the same multiset of
  effects over the dayparts and vice versa), so either feature alone carries *exactly* no
  information about the label; only the pair does;
* redundant features (``user_id_copy``: a bijective relabelling, ``price_cents``: ``price x
  100``) and the near-copy ``item_near_copy`` (10% of rows redrawn) and the noise features add
  nothing to the logit.

The layout is configurable (:class:`SyntheticConfig`): more rare flags (``promo_flag_2``,
...: ``"none"`` in 99% of rows, else one of 20 coupon codes with their own effects), more
multi-hot fields (``tags_2``, ...), fewer dense informative features, and no interaction pair
or near-copy; the defaults give the layout above. :func:`selection_benchmark_config` is a
40-field feature-selection benchmark (10 informative fields, 2 redundant, 28 noise), and
``embedding_dim="by_cardinality"`` (or :func:`heterogeneous_dims` on any schema) gives
per-feature embedding widths.

The effect tables are not stored: :class:`GroundTruth` keeps the generator config and rebuilds
them from the seed, so its dict stays small and JSON/YAML-able.

Features draw from independent random streams keyed by ``(seed, feature name)``: the same
config gives the same frame, and adding noise features leaves the other columns unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd

from recsys.data.raw import RawData, ReadReport
from recsys.data.readers.base import Reader
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.data.synthetic.plan import (
    BY_CARDINALITY,
    LEARNABLE_MIN_COUNT,
    Effect,
    FeatureRole,
    PlanFeature,
    SyntheticConfig,
    frame_columns,
    learnable_share_of,
    needed_features,
    parse_codes,
    plan_for,
    rng_stream,
    sample_codes,
    solve_bias,
    term_contributions,
)
from recsys.metrics import binary_auc

__all__ = [
    "BY_CARDINALITY",
    "LEARNABLE_MIN_COUNT",
    "FeatureRole",
    "FeatureTruth",
    "GroundTruth",
    "SyntheticConfig",
    "SyntheticReader",
    "dim_for_cardinality",
    "generate",
    "heterogeneous_dims",
    "oracle_auc",
    "roc_auc",
    "selection_benchmark_config",
]

#: ROC AUC by the rank-sum formula (ties averaged); NaN when one class is absent (the shared
#: :func:`recsys.metrics.binary_auc`, under the name this module has always exported)
roc_auc = binary_auc


# ---------------------------------------------------------------------------------------------
# ground truth
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FeatureTruth:
    """The planted truth about one feature.

    Args:
        name: feature name.
        role: what it contributes.
        kind: ``categorical``, ``multi_categorical`` or ``dense``.
        cardinality: number of possible values (token vocabulary for multi-hot); None for dense.
        strength: planted std of its logit contribution (for ``interaction``: of the pair's
            term); 0 for redundant, near-redundant and noise features.
        effect: the shape of the contribution (``categorical``, ``bag_sum``, ``rare_flag``,
            ``log_linear``, ``linear``, ``quadratic``, ``latin_square`` or ``none``).
        contribution_std: std of the contribution realised in the generated rows.
        learnable_share: share of the realised contribution variance carried by rows whose
            value (token, or value pair for an interaction) occurs at least
            ``LEARNABLE_MIN_COUNT`` times in the sample: a rough ceiling on how much of the
            effect a model can learn from this many rows. Near 1 for everything except the
            high-cardinality ``user_id`` (mostly one-off ids: ~0.3 at 100k rows); 0 without
            an effect.
        source: the feature a (near-)redundant feature copies.
        partner: the other feature of an interaction.
        copy_rate: fraction of rows copied from ``source`` (1.0 for exact copies).
        default: the value a sparse-informative feature holds in most rows.
        default_rate: planted fraction of rows at ``default``.
    """

    name: str
    role: FeatureRole
    kind: FeatureKind
    cardinality: int | None = None
    strength: float = 0.0
    effect: Effect = "none"
    contribution_std: float = 0.0
    learnable_share: float = 0.0
    source: str | None = None
    partner: str | None = None
    copy_rate: float | None = None
    default: str | None = None
    default_rate: float | None = None

    @property
    def effective_strength(self) -> float:
        """``strength * sqrt(learnable_share)``: the part of the effect this sample can teach."""
        return self.strength * float(np.sqrt(self.learnable_share))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["role"], out["kind"] = self.role.value, self.kind.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureTruth:
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in known}, "role": FeatureRole(data["role"]),
                      "kind": FeatureKind(data["kind"])})


@dataclass(frozen=True)
class GroundTruth:
    """Everything planted in one synthetic dataset.

    The per-category effect tables are rebuilt from ``config`` (they are a function of the
    seed), so :meth:`true_logit` works on a :meth:`from_dict` copy too.

    Args:
        config: the generator config.
        features: one entry per feature, in schema order.
        bias: logit bias solved for ``config.base_ctr``.
        ctr: realised click rate.
        oracle_auc: AUC of the true probabilities against the sampled labels (the ceiling a
            model can reach on this sample).
    """

    config: SyntheticConfig
    features: tuple[FeatureTruth, ...]
    bias: float
    ctr: float = float("nan")
    oracle_auc: float = float("nan")
    _index: dict[str, FeatureTruth] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(self.features))
        object.__setattr__(self, "_index", {f.name: f for f in self.features})

    def __getitem__(self, name: str) -> FeatureTruth:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"unknown synthetic feature {name!r}; available: {list(self._index)}") from None

    @property
    def roles(self) -> dict[str, FeatureRole]:
        return {f.name: f.role for f in self.features}

    def names(self, *roles: FeatureRole | str) -> list[str]:
        """Features with any of ``roles`` (all features when none given), in schema order."""
        wanted = {FeatureRole(r) for r in roles} if roles else set(FeatureRole)
        return [f.name for f in self.features if f.role in wanted]

    @property
    def signal(self) -> list[str]:
        """Features with a planted effect: informative, sparse-informative and interaction."""
        return self.names(FeatureRole.INFORMATIVE, FeatureRole.SPARSE_INFORMATIVE, FeatureRole.INTERACTION)

    def importance_order(self, effective: bool = False) -> list[str]:
        """Signal features by planted strength, strongest first (ties in schema order).

        Args:
            effective: order by :attr:`FeatureTruth.effective_strength` instead, i.e. by what
                the generated sample can reveal (moves ``user_id`` down at small sizes).
        """
        key = (lambda n: -self[n].effective_strength) if effective else (lambda n: -self[n].strength)
        return sorted(self.signal, key=key)

    # -- the true logit --------------------------------------------------------------------
    def contributions(self, frame: pd.DataFrame) -> dict[str, np.ndarray]:
        """Per-term logit contributions of every row (the interaction is ``"ad_slot*daypart"``)."""
        plan = plan_for(self.config)
        return term_contributions(plan, parse_codes(frame, plan, needed_features(plan)))

    def true_logit(self, frame: pd.DataFrame) -> np.ndarray:
        """The logit each row's label was drawn from (float64, one per row of ``frame``)."""
        return self.bias + np.sum(list(self.contributions(frame).values()), axis=0)

    def true_probability(self, frame: pd.DataFrame) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.true_logit(frame)))

    # -- files -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-able dict (plain Python types only)."""
        return {
            "config": self.config.to_dict(),
            "bias": float(self.bias),
            "ctr": float(self.ctr),
            "oracle_auc": float(self.oracle_auc),
            "importance_order": self.importance_order(),
            "effective_importance_order": self.importance_order(effective=True),
            "features": [f.to_dict() for f in self.features],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroundTruth:
        return cls(
            config=SyntheticConfig.from_dict(data["config"]),
            features=tuple(FeatureTruth.from_dict(f) for f in data["features"]),
            bias=float(data["bias"]),
            ctr=float(data.get("ctr", float("nan"))),
            oracle_auc=float(data.get("oracle_auc", float("nan"))),
        )

    @classmethod
    def from_raw(cls, raw: RawData) -> GroundTruth:
        """The truth stored in ``raw.schema.extras["ground_truth"]`` by :func:`generate`."""
        if "ground_truth" not in raw.schema.extras:
            raise KeyError(f"{raw.report.source}: the schema has no extras['ground_truth'] (not synthetic data?)")
        return cls.from_dict(raw.schema.extras["ground_truth"])


# ---------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------
def generate(config: SyntheticConfig | None = None) -> tuple[RawData, GroundTruth]:
    """Generate a synthetic CTR dataset and its ground truth.

    Args:
        config: generator settings (defaults: 100k rows, seed 0).

    Returns:
        ``(raw, truth)``: the frame (index ``1..n_rows``, label int8 0/1) with its schema and
        report; ``truth.to_dict()`` is also in ``raw.schema.extras["ground_truth"]`` and
        ``raw.report.notes["ground_truth"]``.
    """
    config = config or SyntheticConfig()
    plan = plan_for(config)
    codes = sample_codes(config, plan)
    contrib = term_contributions(plan, codes)
    logit = np.sum(list(contrib.values()), axis=0)
    bias = solve_bias(logit, config.base_ctr)
    logit = logit + bias
    prob = 1.0 / (1.0 + np.exp(-logit))
    labels = (rng_stream(config.seed, "label").random(config.n_rows) < prob).astype(np.int8)

    cols = frame_columns(plan, codes)
    frame = pd.DataFrame(cols, index=pd.RangeIndex(1, config.n_rows + 1))
    frame["label"] = labels

    def realised(f: PlanFeature) -> float:
        term = "ad_slot*daypart" if f.role is FeatureRole.INTERACTION else f.name
        return float(contrib[term].std()) if term in contrib else 0.0

    truth = GroundTruth(
        config=config,
        features=tuple(
            FeatureTruth(
                name=f.name, role=f.role, kind=f.kind, cardinality=f.cardinality, strength=float(f.strength),
                effect=f.effect, contribution_std=realised(f),
                learnable_share=learnable_share_of(f, codes, contrib), source=f.source or None, partner=f.partner,
                copy_rate=f.copy_rate if f.source else None, default=f.default,
                default_rate=f.default_rate if f.default is not None else None,
            )
            for f in plan.features
        ),
        bias=bias,
        ctr=float(labels.mean()),
        oracle_auc=roc_auc(prob, labels),
    )

    def dim(f: PlanFeature) -> int:
        if config.embedding_dim != BY_CARDINALITY:
            return int(config.embedding_dim)
        return dim_for_cardinality(f.cardinality) if f.cardinality else 16  # dense: unused

    specs = tuple(
        FeatureSpec(f.name, f.kind, embedding_dim=dim(f), transform=f.transform, fill_value=float(f.fill_value))
        for f in plan.features
    )
    gt = truth.to_dict()
    schema = Schema(specs, label="label", name="synthetic", extras={"ground_truth": gt})
    report = ReadReport(source=f"synthetic(seed={config.seed}, n_rows={config.n_rows})", rows_read=config.n_rows,
                        notes={"ground_truth": gt})
    return RawData(frame, schema, report), truth


def dim_for_cardinality(cardinality: int) -> int:
    """Embedding width for a feature with ``cardinality`` possible values (multiples of 4).

    4 up to 10 values, 8 up to 1,000, 16 up to 20,000, 32 above.
    """
    if cardinality <= 10:
        return 4
    if cardinality <= 1_000:
        return 8
    if cardinality <= 20_000:
        return 16
    return 32


def heterogeneous_dims(schema: Schema) -> dict[str, int]:
    """Per-feature embedding widths by cardinality (:func:`dim_for_cardinality`), for ``schema.with_dims``.

    The cardinality of a sparse feature is its vocabulary size: ``num_embeddings - 1`` once
    the encoders are fitted, else the planted cardinality in a synthetic schema's
    ``extras["ground_truth"]``; hashed features use ``hash_size``.

    Raises:
        ValueError: a sparse feature whose cardinality is unknown (an unfitted non-synthetic schema).
    """
    planted = {f["name"]: f.get("cardinality") for f in schema.extras.get("ground_truth", {}).get("features", [])}
    dims: dict[str, int] = {}
    for f in schema.sparse:
        if f.num_embeddings is not None:
            card = f.num_embeddings - 1
        elif f.hash_size is not None:
            card = f.hash_size
        elif planted.get(f.name):
            card = planted[f.name]
        else:
            raise ValueError(f"feature {f.name!r}: unknown cardinality (fit the encoders first)")
        dims[f.name] = dim_for_cardinality(int(card))
    return dims


def selection_benchmark_config(n_rows: int = 100_000, seed: int = 0, **overrides: Any) -> SyntheticConfig:
    """The 40-field feature-selection benchmark: 10 informative fields, 2 redundant copies, 28 noise.

    ``overrides`` replace any other :class:`SyntheticConfig` field (e.g. ``embedding_dim``).
    With ``cardinality_scale=0.05`` every informative id is learnable from 100k rows
    (``learnable_share`` >= 0.97). Strengths are before ``signal_scale``; learnable share and
    oracle AUC at 100k rows, seed 0:

    ===================  =========  ==================  ===========  ========  =========
    feature              kind       role                cardinality  strength  learnable
    ===================  =========  ==================  ===========  ========  =========
    user_id              cat        informative         5,000        0.55      0.97
    item_id              cat        informative         1,000        0.90      1.00
    site_category        cat        informative         30           0.75      1.00
    device_type          cat        informative         4            0.40      1.00
    tags                 multi-hot  informative         500          0.60      1.00
    tags_2               multi-hot  informative         300          0.45      1.00
    promo_flag           cat        sparse_informative  2            0.30      1.00
    promo_flag_2         cat        sparse_informative  21           0.42      1.00
    price                dense      informative                      0.50      1.00
    relevance_score      dense      informative                      0.35      1.00
    user_id_copy         cat        redundant: user_id  5,000
    price_cents          dense      redundant: price
    noise_* (20)         cat        noise               2 - 5,000
    noise_tags           multi-hot  noise               200
    noise_dense* (7)     dense      noise
    ===================  =========  ==================  ===========  ========  =========

    The 20 noise categoricals cycle through ``noise_c2, noise_c10, noise_c1000, noise_id,
    noise_c100, noise_c10000, noise_c5, noise_c50`` (then with suffixes ``_2``, ``_3``):
    three user-like ``noise_id*`` ids (5,000 values, mostly rare), three ``noise_c1000*``
    and two ``noise_c10000*`` (500 values at this scale). ``promo_flag`` / ``promo_flag_2``
    are at ``"0"`` / ``"none"`` in 99% of rows. No interaction pair, no near-copy. Oracle
    AUC ~0.84. In a LightningCLI YAML, the same layout is::

        data:
          reader:
            class_path: recsys.data.synthetic.SyntheticReader
            init_args: {n_noise: 20, n_noise_dense: 7, cardinality_scale: 0.05, n_rare_flags: 2,
                        n_tag_fields: 2, n_dense_informative: 2, interaction: false, near_copy: false}
    """
    base: dict[str, Any] = dict(
        n_rows=n_rows, seed=seed, n_noise=20, n_noise_dense=7, cardinality_scale=0.05, n_rare_flags=2,
        n_tag_fields=2, n_dense_informative=2, interaction=False, near_copy=False,
    )
    unknown = set(overrides) - {f.name for f in fields(SyntheticConfig)}
    if unknown:
        raise TypeError(f"unknown SyntheticConfig fields: {sorted(unknown)}")
    return SyntheticConfig(**{**base, **overrides})


def oracle_auc(raw: RawData, ground_truth: GroundTruth | None = None) -> float:
    """AUC of the true click probabilities against the labels of ``raw`` (any row subset)."""
    truth = ground_truth or GroundTruth.from_raw(raw)
    return roc_auc(truth.true_logit(raw.frame), raw.labels)


class SyntheticReader(Reader):
    """The embedded default dataset: synthetic CTR data with planted ground truth.

    See the module docstring for the features; the truth is ``GroundTruth.from_raw(raw)``.

    Args:
        n_rows: rows to generate.
        seed: random seed (same seed, same data).
        embedding_dim: embedding width of every sparse feature, or ``"by_cardinality"`` for
            per-feature widths 4/8/16/32 by number of values.
        base_ctr: target click rate.
        n_noise: noise categoricals (see :class:`SyntheticConfig`).
        n_noise_dense: noise dense features.
        cardinality_scale: multiplies the large vocabularies.
        signal_scale: multiplies every planted effect.
        n_rare_flags: sparse-informative fields at their default in 99% of rows
            (``promo_flag``, ``promo_flag_2``, ...).
        n_tag_fields: informative multi-hot fields (``tags``, ``tags_2``, ...).
        n_dense_informative: informative dense features, the first n of ``price``,
            ``relevance_score``, ``engagement_score``.
        interaction: include the ``ad_slot`` x ``daypart`` interaction pair.
        near_copy: include ``item_near_copy``.
    """

    name = "synthetic"

    def __init__(
        self,
        n_rows: int = 100_000,
        seed: int = 0,
        embedding_dim: int | str = 16,
        base_ctr: float = 0.25,
        n_noise: int = 4,
        n_noise_dense: int = 2,
        cardinality_scale: float = 1.0,
        signal_scale: float = 1.0,
        n_rare_flags: int = 1,
        n_tag_fields: int = 1,
        n_dense_informative: int = 3,
        interaction: bool = True,
        near_copy: bool = True,
    ) -> None:
        self.n_rows = n_rows
        self.seed = seed
        self.embedding_dim = embedding_dim
        self.base_ctr = base_ctr
        self.n_noise = n_noise
        self.n_noise_dense = n_noise_dense
        self.cardinality_scale = cardinality_scale
        self.signal_scale = signal_scale
        self.n_rare_flags = n_rare_flags
        self.n_tag_fields = n_tag_fields
        self.n_dense_informative = n_dense_informative
        self.interaction = interaction
        self.near_copy = near_copy
        _ = self.config  # validate early

    @property
    def config(self) -> SyntheticConfig:
        return SyntheticConfig(**self.options())

    def read(self) -> RawData:
        return generate(self.config)[0]

    def ground_truth(self) -> GroundTruth:
        """The truth of :meth:`read`'s data (generates it)."""
        return generate(self.config)[1]
