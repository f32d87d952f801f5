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

import zlib
from dataclasses import asdict, dataclass, field, fields
from enum import Enum, unique
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from recsys.data.raw import RawData, ReadReport
from recsys.data.readers.base import Reader
from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema

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

#: (name, cardinality, zipf exponent, scales with ``cardinality_scale``) of the noise
#: categoricals, taken in order for ``n_noise``; ``noise_id`` is user-like (see ``_user_probs``)
_NOISE_SPARSE: list[tuple[str, int, float, bool]] = [
    ("noise_c2", 2, 1.0, False),
    ("noise_c10", 10, 0.8, False),
    ("noise_c1000", 1000, 1.0, False),
    ("noise_id", 100_000, -1.0, True),
    ("noise_c100", 100, 0.5, False),
    ("noise_c10000", 10_000, 1.0, True),
    ("noise_c5", 5, 0.0, False),
    ("noise_c50", 50, 1.0, False),
]
_DAYPARTS = ["night", "early_morning", "morning", "afternoon", "evening", "late_evening"]
_DEVICES = ["mobile", "desktop", "tablet", "tv"]
_MAX_TAGS = 5
_MAX_NOISE_TAGS = 3
_PROMO_RATE = 0.01
#: extra rare flags (``promo_flag_2``, ...): at ``"none"`` in 99% of rows, else one of this many codes
_N_COUPONS = 20
#: planted strength (before ``signal_scale``) of the extra multi-hot / rare-flag fields
_TAGS_K_STRENGTH = 0.45
_FLAG_K_STRENGTH = 0.42
#: the informative dense features, taken in order for ``n_dense_informative``
_DENSE_INFORMATIVE = ("price", "relevance_score", "engagement_score")
#: ``embedding_dim`` value that sizes each sparse feature by its cardinality (:func:`dim_for_cardinality`)
BY_CARDINALITY = "by_cardinality"
_NEAR_COPY_NOISE = 0.1
_PRICE_MU, _PRICE_SIGMA = 3.0, 0.8  # log-normal price: median exp(3) ~ 20.09
_ENGAGEMENT_MU, _ENGAGEMENT_SIGMA = 5.0, 2.0
#: a value seen at least this often in a sample counts as learnable (``FeatureTruth.learnable_share``)
LEARNABLE_MIN_COUNT = 10


@unique
class FeatureRole(str, Enum):
    """What a synthetic feature contributes to the label."""

    INFORMATIVE = "informative"  # own additive effect on the logit
    SPARSE_INFORMATIVE = "sparse_informative"  # at its default value in ~99% of rows, strong otherwise
    INTERACTION = "interaction"  # signal only jointly with ``partner``; alone exactly none
    REDUNDANT = "redundant"  # bijection of ``source``: the same information, different values
    NEAR_REDUNDANT = "near_redundant"  # ``source`` with a fraction of rows redrawn
    NOISE = "noise"  # independent of everything


@dataclass(frozen=True)
class SyntheticConfig:
    """Generator settings.

    Args:
        n_rows: rows to generate.
        seed: seed of every random stream (data and effect tables).
        embedding_dim: embedding width of every sparse feature in the schema, or
            ``"by_cardinality"`` for per-feature widths from :func:`dim_for_cardinality`
            (4 / 8 / 16 / 32 by the number of possible values).
        base_ctr: target click rate; the logit bias is solved so that the mean true
            probability of the generated rows equals it.
        n_noise: noise categoricals, taken in order from ``noise_c2, noise_c10, noise_c1000,
            noise_id, noise_c100, noise_c10000, noise_c5, noise_c50`` (beyond 8 the list
            repeats with a ``_2``, ``_3``... suffix).
        n_noise_dense: noise dense features ``noise_dense``, ``noise_dense_2``, ...
        cardinality_scale: multiplies the large vocabularies (``user_id``, ``item_id``,
            ``noise_id``, ``noise_c10000``); use e.g. 0.1 for small fast datasets.
        signal_scale: multiplies every planted strength (lower = harder task).
        n_rare_flags: sparse-informative categoricals at their default in 99% of rows:
            ``promo_flag`` (binary ``"0"``/``"1"``), then ``promo_flag_2``, ... (``"none"`` or
            one of 20 coupon codes ``c0..c19``, each with its own, mostly positive, effect).
        n_tag_fields: informative multi-hot fields: ``tags`` (500 tokens), then ``tags_2``,
            ... (300 tokens each, own effects).
        n_dense_informative: informative dense features, the first n of ``price``,
            ``relevance_score``, ``engagement_score`` (0-3); ``price_cents`` (the redundant
            copy of ``price``) exists only with ``price``.
        interaction: include the ``ad_slot`` x ``daypart`` Latin-square pair; False drops both
            features and the interaction term.
        near_copy: include ``item_near_copy``.
    """

    n_rows: int = 100_000
    seed: int = 0
    embedding_dim: int | str = 16
    base_ctr: float = 0.25
    n_noise: int = 4
    n_noise_dense: int = 2
    cardinality_scale: float = 1.0
    signal_scale: float = 1.0
    n_rare_flags: int = 1
    n_tag_fields: int = 1
    n_dense_informative: int = 3
    interaction: bool = True
    near_copy: bool = True

    def __post_init__(self) -> None:
        if self.n_rows < 1:
            raise ValueError(f"n_rows must be >= 1, got {self.n_rows}")
        if not 0.0 < self.base_ctr < 1.0:
            raise ValueError(f"base_ctr must be in (0, 1), got {self.base_ctr}")
        if self.n_noise < 0 or self.n_noise_dense < 0:
            raise ValueError("n_noise and n_noise_dense must be >= 0")
        if self.cardinality_scale <= 0 or self.signal_scale < 0:
            raise ValueError("cardinality_scale must be > 0 and signal_scale >= 0")
        if isinstance(self.embedding_dim, str):
            if self.embedding_dim != BY_CARDINALITY:
                raise ValueError(f"embedding_dim must be >= 1 or {BY_CARDINALITY!r}, got {self.embedding_dim!r}")
        elif self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {self.embedding_dim}")
        if self.n_rare_flags < 0 or self.n_tag_fields < 0:
            raise ValueError("n_rare_flags and n_tag_fields must be >= 0")
        if not 0 <= self.n_dense_informative <= len(_DENSE_INFORMATIVE):
            raise ValueError(
                f"n_dense_informative must be in 0..{len(_DENSE_INFORMATIVE)}, got {self.n_dense_informative}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SyntheticConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# ---------------------------------------------------------------------------------------------
# the plan: every feature's distribution and effect table, rebuilt from the config
# ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Feature:
    name: str
    kind: FeatureKind
    role: FeatureRole
    strength: float = 0.0  # planted std of the logit contribution (0: none of its own)
    effect: str = "none"  # categorical | bag_sum | rare_flag | log_linear | linear | quadratic | latin_square
    vocab: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))  # category strings
    probs: np.ndarray = field(default_factory=lambda: np.empty(0))  # category (token) frequencies
    effects: np.ndarray = field(default_factory=lambda: np.empty(0))  # per-category (token) logit effect
    max_len: int = 1  # multi-hot: tokens per row 0..max_len
    source: str = ""
    partner: str | None = None
    copy_rate: float = 1.0
    default: str | None = None
    default_rate: float = 1.0
    transform: DenseTransform = DenseTransform.NONE
    fill_value: float = 0.0
    nan_rate: float = 0.0
    dist: str = ""  # dense distribution: lognormal | normal | exponential
    loc: float = 0.0
    scale: float = 1.0

    @property
    def cardinality(self) -> int | None:
        return None if self.kind is FeatureKind.DENSE else len(self.vocab)


@dataclass(eq=False)
class _Plan:
    features: list[_Feature]
    interaction: np.ndarray | None  # ad_slot x daypart contribution table (None: no pair)
    perm: np.ndarray  # user_id -> user_id_copy index bijection

    def __getitem__(self, name: str) -> _Feature:
        return self._by_name[name]

    def __post_init__(self) -> None:
        self._by_name = {f.name: f for f in self.features}


def _stream(seed: int, *tags: str | int) -> np.random.Generator:
    """An independent generator per (seed, tag...)."""
    key = [int(seed) & 0xFFFFFFFF] + [zlib.crc32(t.encode()) if isinstance(t, str) else int(t) for t in tags]
    return np.random.default_rng(key)


def _vocab(prefix: str, card: int) -> np.ndarray:
    return np.char.add(prefix, np.arange(card).astype(str)).astype(object)


def _zipf(card: int, a: float) -> np.ndarray:
    p = np.arange(1, card + 1, dtype=np.float64) ** -a
    return p / p.sum()


def _user_probs(card: int) -> np.ndarray:
    """A Zipf head (30% of the mass, exponent 1.1) over a flat tail: ~54k distinct ids in 100k rows."""
    return 0.3 * _zipf(card, 1.1) + 0.7 / card


def _effects(rng: np.random.Generator, probs: np.ndarray, strength: float) -> np.ndarray:
    """Random effects centred and scaled so the contribution has mean 0 and std ``strength``."""
    e = rng.standard_normal(len(probs))
    e -= probs @ e
    sd = float(np.sqrt(probs @ e**2))
    return e * (strength / sd) if sd > 0 else e


def _suffixed(name: str, k: int) -> str:
    """``name`` for the first (k=0) of a repeated feature, ``name_{k+1}`` after."""
    return name if k == 0 else f"{name}_{k + 1}"


@lru_cache(maxsize=4)
def _plan(seed: int, n_noise: int, n_noise_dense: int, cardinality_scale: float, signal_scale: float,
          n_rare_flags: int = 1, n_tag_fields: int = 1, n_dense_informative: int = 3, interaction: bool = True,
          near_copy: bool = True) -> _Plan:
    s = signal_scale

    def card(base: int) -> int:
        return max(2, int(round(base * cardinality_scale)))

    def cat(name: str, values: str | list[str], n: int, probs: np.ndarray, strength: float = 0.0,
            role: FeatureRole = FeatureRole.INFORMATIVE, **kw: Any) -> _Feature:
        """A categorical with ``n`` values (``values`` + index, or the given strings)."""
        vocab = _vocab(values, n) if isinstance(values, str) else np.asarray(values, dtype=object)
        f = _Feature(name, FeatureKind.CATEGORICAL, role, strength, vocab=vocab, probs=probs, **kw)
        if role is FeatureRole.INFORMATIVE:
            f.effect, f.effects = "categorical", _effects(_stream(seed, name, 1), probs, strength)
        return f

    n_user, n_item = card(100_000), card(20_000)
    feats = [
        cat("user_id", "u", n_user, _user_probs(n_user), 0.55 * s),
        cat("item_id", "i", n_item, _zipf(n_item, 1.05), 0.9 * s),
        cat("site_category", "cat", 30, _zipf(30, 0.8), 0.75 * s),
        cat("device_type", _DEVICES, 4, np.array([0.55, 0.30, 0.10, 0.05]), 0.4 * s),
    ]
    for k in range(n_tag_fields):
        name = _suffixed("tags", k)
        n_tok, strength, prefix = (500, 0.6 * s, "t") if k == 0 else (300, _TAGS_K_STRENGTH * s, f"t{k + 1}_")
        tag_probs = _zipf(n_tok, 1.0)
        tag_eff = _effects(_stream(seed, name, 1), tag_probs, strength / np.sqrt(_MAX_TAGS / 2))
        feats.append(_Feature(name, FeatureKind.MULTI_CATEGORICAL, FeatureRole.INFORMATIVE, strength, "bag_sum",
                              _vocab(prefix, n_tok), tag_probs, tag_eff, max_len=_MAX_TAGS))
    for k in range(n_rare_flags):
        name, rare = _suffixed("promo_flag", k), _PROMO_RATE
        if k == 0:  # binary: "1" in 1% of rows, a large positive effect
            strength = 0.3 * s
            vocab, probs = np.array(["0", "1"], dtype=object), np.array([1 - rare, rare])
            eff = np.array([0.0, strength / np.sqrt(rare * (1 - rare))])
        else:  # "none" or one of _N_COUPONS codes, each with its own (mostly positive) effect
            strength = _FLAG_K_STRENGTH * s
            vocab = np.concatenate([np.array(["none"], dtype=object), _vocab("c", _N_COUPONS)])
            probs = np.concatenate([[1 - rare], rare * _zipf(_N_COUPONS, 0.5)])
            eff = np.concatenate([[0.0], 1.0 + 0.5 * _stream(seed, name, 1).standard_normal(_N_COUPONS)])
            sd = float(np.sqrt(probs @ eff**2 - (probs @ eff) ** 2))
            eff *= strength / sd if sd > 0 else 0.0  # contribution std == strength
        feats.append(_Feature(name, FeatureKind.CATEGORICAL, FeatureRole.SPARSE_INFORMATIVE, strength, "rare_flag",
                              vocab, probs, eff, default=str(vocab[0]), default_rate=1 - rare))
    table = None
    if interaction:
        uniform6 = np.full(6, 1 / 6)
        for name, partner, values in (("ad_slot", "daypart", "slot"), ("daypart", "ad_slot", _DAYPARTS)):
            feats.append(cat(name, values, 6, uniform6, 0.45 * s, FeatureRole.INTERACTION, partner=partner,
                             effect="latin_square"))
        # Latin square: cell (a, b) gets v[(pa[a] + pb[b]) % 6]; every row/column holds all of v
        rng = _stream(seed, "ad_slot*daypart", 1)
        v = rng.standard_normal(6)
        v = (v - v.mean()) / v.std() * 0.45 * s
        pa, pb = rng.permutation(6), rng.permutation(6)
        table = v[(pa[:, None] + pb[None, :]) % 6]
    # redundant copies and noise
    perm = _stream(seed, "user_id_copy", 1).permutation(n_user)
    feats.append(cat("user_id_copy", "x", n_user, _user_probs(n_user)[np.argsort(perm)], role=FeatureRole.REDUNDANT,
                     source="user_id"))
    if near_copy:
        feats.append(cat("item_near_copy", "i", n_item, _zipf(n_item, 1.05), role=FeatureRole.NEAR_REDUNDANT,
                         source="item_id", copy_rate=1 - _NEAR_COPY_NOISE))
    for k in range(n_noise):
        name, c, a, scaled = _NOISE_SPARSE[k % len(_NOISE_SPARSE)]
        name = name if k < len(_NOISE_SPARSE) else f"{name}_{k // len(_NOISE_SPARSE) + 1}"
        c = card(c) if scaled else c
        probs = _user_probs(c) if a < 0 else _zipf(c, a)
        feats.append(cat(name, "n", c, probs, role=FeatureRole.NOISE))
    feats.append(_Feature("noise_tags", FeatureKind.MULTI_CATEGORICAL, FeatureRole.NOISE, vocab=_vocab("g", 200),
                          probs=_zipf(200, 1.0), max_len=_MAX_NOISE_TAGS))
    # dense
    dense = FeatureKind.DENSE
    feats += [
        _Feature("price", dense, FeatureRole.INFORMATIVE, 0.5 * s, "log_linear", transform=DenseTransform.STANDARDIZE,
                 fill_value=round(float(np.exp(_PRICE_MU)), 2), nan_rate=0.02, dist="lognormal", loc=_PRICE_MU,
                 scale=_PRICE_SIGMA),
        _Feature("relevance_score", dense, FeatureRole.INFORMATIVE, 0.35 * s, "linear", fill_value=0.0, nan_rate=0.01,
                 dist="normal"),
        _Feature("engagement_score", dense, FeatureRole.INFORMATIVE, 0.25 * s, "quadratic",
                 transform=DenseTransform.STANDARDIZE, fill_value=_ENGAGEMENT_MU, nan_rate=0.01, dist="normal",
                 loc=_ENGAGEMENT_MU, scale=_ENGAGEMENT_SIGMA),
    ][:n_dense_informative]
    if n_dense_informative >= 1:  # price
        feats.append(_Feature("price_cents", dense, FeatureRole.REDUNDANT, transform=DenseTransform.STANDARDIZE,
                              fill_value=round(float(np.exp(_PRICE_MU)), 2) * 100, source="price"))
    for k in range(n_noise_dense):
        name = "noise_dense" if k == 0 else f"noise_dense_{k + 1}"
        if k % 2 == 0:
            feats.append(_Feature(name, dense, FeatureRole.NOISE, nan_rate=0.01, dist="normal"))
        else:
            feats.append(_Feature(name, dense, FeatureRole.NOISE, transform=DenseTransform.STANDARDIZE,
                                  fill_value=10.0, nan_rate=0.01, dist="exponential", scale=10.0))
    return _Plan(feats, table, perm)


def _plan_for(config: SyntheticConfig) -> _Plan:
    return _plan(config.seed, config.n_noise, config.n_noise_dense, float(config.cardinality_scale),
                 float(config.signal_scale), int(config.n_rare_flags), int(config.n_tag_fields),
                 int(config.n_dense_informative), bool(config.interaction), bool(config.near_copy))


# ---------------------------------------------------------------------------------------------
# codes (category indices / token matrices / floats) <-> frame cells, and the logit
# ---------------------------------------------------------------------------------------------
def _sample_bags(rng: np.random.Generator, n: int, f: _Feature) -> np.ndarray:
    """n x max_len token matrix: each row's distinct tokens sorted first, ``len(vocab)`` as padding."""
    v, k = len(f.vocab), f.max_len
    tokens = rng.choice(v, size=(n, k), p=f.probs)
    lengths = rng.integers(0, k + 1, size=n)
    tokens[np.arange(k)[None, :] >= lengths[:, None]] = v
    tokens.sort(axis=1)
    dup = tokens[:, 1:] == tokens[:, :-1]
    tokens[:, 1:][dup] = v
    tokens.sort(axis=1)
    return tokens


def _sample(config: SyntheticConfig, plan: _Plan) -> dict[str, np.ndarray]:
    n, codes = config.n_rows, {}
    for f in plan.features:
        rng = _stream(config.seed, f.name)
        if f.kind is FeatureKind.MULTI_CATEGORICAL:
            codes[f.name] = _sample_bags(rng, n, f)
        elif f.kind is FeatureKind.CATEGORICAL:
            if f.role is FeatureRole.REDUNDANT:
                codes[f.name] = plan.perm[codes[f.source]]
            elif f.role is FeatureRole.NEAR_REDUNDANT:
                redraw = rng.random(n) >= f.copy_rate
                codes[f.name] = np.where(redraw, rng.choice(len(f.vocab), size=n, p=f.probs), codes[f.source])
            elif f.role is FeatureRole.SPARSE_INFORMATIVE:
                c = (rng.random(n) >= f.default_rate).astype(np.int64)
                if len(f.vocab) > 2:  # which of the non-default values
                    rare = f.probs[1:] / f.probs[1:].sum()
                    c[c == 1] = 1 + rng.choice(len(rare), size=int(c.sum()), p=rare)
                codes[f.name] = c
            else:
                codes[f.name] = rng.choice(len(f.vocab), size=n, p=f.probs)
        else:
            if f.role is FeatureRole.REDUNDANT:
                codes[f.name] = np.round(codes[f.source] * 100.0)
                continue
            if f.dist == "lognormal":
                x = np.maximum(np.round(np.exp(f.loc + f.scale * rng.standard_normal(n)), 2), 0.01)
            elif f.dist == "exponential":
                x = rng.exponential(f.scale, n)
            else:
                x = f.loc + f.scale * rng.standard_normal(n)
            x[rng.random(n) < f.nan_rate] = np.nan
            codes[f.name] = x
    return codes


def _cells(values: pd.Series | np.ndarray) -> pd.Series:
    s = pd.Series(values, copy=False)
    return s.where(s.notna(), "").astype(str)


def _parse(frame: pd.DataFrame, plan: _Plan, names: list[str]) -> dict[str, np.ndarray]:
    """Codes of the features ``names`` read back from frame cells (inverse of :func:`_frame_columns`)."""
    codes = {}
    for name in names:
        f = plan[name]
        if name not in frame.columns:
            raise KeyError(f"the true logit needs column {name!r}, which the frame lacks")
        col = frame[name]
        if f.kind is FeatureKind.DENSE:
            codes[name] = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
            continue
        index = pd.Index(f.vocab)
        if f.kind is FeatureKind.CATEGORICAL:
            idx = index.get_indexer(_cells(col).to_numpy(dtype=object))
            rows = np.arange(len(col))
        else:
            parts = _cells(col).reset_index(drop=True).str.split("|", regex=False).explode()
            parts = parts[parts != ""]
            idx = index.get_indexer(parts.to_numpy(dtype=object))
            rows = parts.index.to_numpy(dtype=np.int64)
        if (idx < 0).any():
            bad = col.iloc[rows[np.argmax(idx < 0)]]
            raise ValueError(f"feature {name!r}: value {bad!r} is not in the synthetic vocabulary")
        if f.kind is FeatureKind.CATEGORICAL:
            codes[name] = idx.astype(np.int64)
        else:
            tokens = np.full((len(col), f.max_len), len(f.vocab), dtype=np.int64)
            starts = np.searchsorted(rows, rows, side="left")
            tokens[rows, np.arange(len(rows)) - starts] = idx
            codes[name] = tokens
    return codes


def _contributions(plan: _Plan, codes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-term logit contributions (no bias); the interaction term is keyed ``"ad_slot*daypart"``."""
    out: dict[str, np.ndarray] = {}
    for f in plan.features:
        if f.effect == "none" or f.effect == "latin_square":
            continue
        c = codes[f.name]
        if f.effect in ("categorical", "rare_flag"):
            out[f.name] = f.effects[c]
        elif f.effect == "bag_sum":
            out[f.name] = np.append(f.effects, 0.0)[c].sum(axis=1)
        else:
            x = np.where(np.isfinite(c), c, f.fill_value)
            if f.effect == "log_linear":
                out[f.name] = -f.strength * (np.log(np.maximum(x, 1e-3)) - f.loc) / f.scale
            elif f.effect == "linear":
                out[f.name] = f.strength * (x - f.loc) / f.scale
            else:  # quadratic (U-shaped), std 1 before scaling for a normal variable
                out[f.name] = f.strength * (((x - f.loc) / f.scale) ** 2 - 1.0) / np.sqrt(2.0)
    if plan.interaction is not None:
        out["ad_slot*daypart"] = plan.interaction[codes["ad_slot"], codes["daypart"]]
    return out


def _needed(plan: _Plan) -> list[str]:
    return [f.name for f in plan.features if f.effect != "none"]


def _frame_columns(plan: _Plan, codes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    cols: dict[str, np.ndarray] = {}
    for f in plan.features:
        c = codes[f.name]
        if f.kind is FeatureKind.CATEGORICAL:
            cols[f.name] = f.vocab[c]
        elif f.kind is FeatureKind.MULTI_CATEGORICAL:
            first = np.append(f.vocab, "")  # padding id -> ""
            rest = np.append(np.char.add("|", f.vocab.astype(str)).astype(object), "")
            cells = first[c[:, 0]]
            for j in range(1, c.shape[1]):
                cells = cells + rest[c[:, j]]
            cols[f.name] = cells
        else:
            cols[f.name] = c
    return cols


def _learnable_share(f: _Feature, codes: dict[str, np.ndarray], contrib: dict[str, np.ndarray]) -> float:
    """See ``FeatureTruth.learnable_share``."""
    if f.role is FeatureRole.INTERACTION:
        c, w = codes["ad_slot"] * 6 + codes["daypart"], contrib["ad_slot*daypart"] ** 2
    elif f.name not in contrib:
        return 0.0
    elif f.kind is FeatureKind.DENSE:
        return 1.0
    elif f.kind is FeatureKind.MULTI_CATEGORICAL:
        tokens = codes[f.name].ravel()
        keep = tokens < len(f.vocab)
        c, w = tokens[keep], f.effects[tokens[keep]] ** 2
    else:
        c, w = codes[f.name], contrib[f.name] ** 2
    total = float(w.sum())
    counts = np.bincount(c)
    return float(w[counts[c] >= LEARNABLE_MIN_COUNT].sum() / total) if total > 0 else 0.0


def _solve_bias(logit: np.ndarray, ctr: float) -> float:
    """The b with ``mean(sigmoid(logit + b)) == ctr`` (Newton steps, clipped)."""
    b = float(np.log(ctr / (1 - ctr)) - np.median(logit))
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(logit + b)))
        gap, slope = float(p.mean() - ctr), float((p * (1 - p)).mean())
        if abs(gap) < 1e-10 or slope <= 0:
            break
        b -= float(np.clip(gap / slope, -2.0, 2.0))
    return b


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC by the rank-sum formula (ties averaged); NaN when one class is absent."""
    labels = np.asarray(labels).astype(bool)
    n1 = int(labels.sum())
    n0 = len(labels) - n1
    if n1 == 0 or n0 == 0:
        return float("nan")
    ranks = pd.Series(np.asarray(scores, dtype=np.float64)).rank(method="average").to_numpy()
    return float((ranks[labels].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


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
    kind: str
    cardinality: int | None = None
    strength: float = 0.0
    effect: str = "none"
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
        out["role"] = self.role.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureTruth:
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in known}, "role": FeatureRole(data["role"])})


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
        plan = _plan_for(self.config)
        return _contributions(plan, _parse(frame, plan, _needed(plan)))

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
    plan = _plan_for(config)
    codes = _sample(config, plan)
    contrib = _contributions(plan, codes)
    logit = np.sum(list(contrib.values()), axis=0)
    bias = _solve_bias(logit, config.base_ctr)
    logit = logit + bias
    prob = 1.0 / (1.0 + np.exp(-logit))
    labels = (_stream(config.seed, "label").random(config.n_rows) < prob).astype(np.int8)

    cols = _frame_columns(plan, codes)
    frame = pd.DataFrame(cols, index=pd.RangeIndex(1, config.n_rows + 1))
    frame["label"] = labels

    def realised(f: _Feature) -> float:
        term = "ad_slot*daypart" if f.role is FeatureRole.INTERACTION else f.name
        return float(contrib[term].std()) if term in contrib else 0.0

    truth = GroundTruth(
        config=config,
        features=tuple(
            FeatureTruth(
                name=f.name, role=f.role, kind=f.kind.value, cardinality=f.cardinality, strength=float(f.strength),
                effect=f.effect, contribution_std=realised(f),
                learnable_share=_learnable_share(f, codes, contrib), source=f.source or None, partner=f.partner,
                copy_rate=f.copy_rate if f.source else None, default=f.default,
                default_rate=f.default_rate if f.default is not None else None,
            )
            for f in plan.features
        ),
        bias=bias,
        ctr=float(labels.mean()),
        oracle_auc=roc_auc(prob, labels),
    )

    def dim(f: _Feature) -> int:
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
