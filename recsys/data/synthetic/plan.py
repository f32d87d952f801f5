"""The planted world behind :mod:`recsys.data.synthetic`: every feature's distribution and
effect table (the *plan*, rebuilt from a :class:`SyntheticConfig` and its seed), the sampling of
rows, the frame cells <-> codes conversion and the per-term logit contributions.

:func:`recsys.data.synthetic.generate` and :class:`recsys.data.synthetic.GroundTruth` are the
public entry points; the underscored helpers here are theirs.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field, fields
from enum import Enum, unique
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import pandas as pd

from recsys.data.schema import DenseTransform, FeatureKind

__all__ = ["BY_CARDINALITY", "LEARNABLE_MIN_COUNT", "DenseDist", "Effect", "FeatureRole", "SyntheticConfig"]

#: the shape of a feature's planted logit contribution (``none``: it has no effect of its own)
Effect = Literal["none", "categorical", "bag_sum", "rare_flag", "log_linear", "linear", "quadratic", "latin_square"]
#: how a dense feature's raw values are drawn (``""`` for sparse features)
DenseDist = Literal["", "lognormal", "normal", "exponential"]

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
class PlanFeature:
    name: str
    kind: FeatureKind
    role: FeatureRole
    strength: float = 0.0  # planted std of the logit contribution (0: none of its own)
    effect: Effect = "none"
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
    dist: DenseDist = ""
    loc: float = 0.0
    scale: float = 1.0

    @property
    def cardinality(self) -> int | None:
        return None if self.kind is FeatureKind.DENSE else len(self.vocab)


@dataclass(eq=False)
class _Plan:
    features: list[PlanFeature]
    interaction: np.ndarray | None  # ad_slot x daypart contribution table (None: no pair)
    perm: np.ndarray  # user_id -> user_id_copy index bijection

    def __getitem__(self, name: str) -> PlanFeature:
        return self._by_name[name]

    def __post_init__(self) -> None:
        self._by_name = {f.name: f for f in self.features}


def rng_stream(seed: int, *tags: str | int) -> np.random.Generator:
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
            role: FeatureRole = FeatureRole.INFORMATIVE, **kw: Any) -> PlanFeature:
        """A categorical with ``n`` values (``values`` + index, or the given strings)."""
        vocab = _vocab(values, n) if isinstance(values, str) else np.asarray(values, dtype=object)
        f = PlanFeature(name, FeatureKind.CATEGORICAL, role, strength, vocab=vocab, probs=probs, **kw)
        if role is FeatureRole.INFORMATIVE:
            f.effect, f.effects = "categorical", _effects(rng_stream(seed, name, 1), probs, strength)
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
        tag_eff = _effects(rng_stream(seed, name, 1), tag_probs, strength / np.sqrt(_MAX_TAGS / 2))
        feats.append(PlanFeature(name, FeatureKind.MULTI_CATEGORICAL, FeatureRole.INFORMATIVE, strength, "bag_sum",
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
            eff = np.concatenate([[0.0], 1.0 + 0.5 * rng_stream(seed, name, 1).standard_normal(_N_COUPONS)])
            sd = float(np.sqrt(probs @ eff**2 - (probs @ eff) ** 2))
            eff *= strength / sd if sd > 0 else 0.0  # contribution std == strength
        feats.append(PlanFeature(name, FeatureKind.CATEGORICAL, FeatureRole.SPARSE_INFORMATIVE, strength, "rare_flag",
                              vocab, probs, eff, default=str(vocab[0]), default_rate=1 - rare))
    table = None
    if interaction:
        uniform6 = np.full(6, 1 / 6)
        for name, partner, values in (("ad_slot", "daypart", "slot"), ("daypart", "ad_slot", _DAYPARTS)):
            feats.append(cat(name, values, 6, uniform6, 0.45 * s, FeatureRole.INTERACTION, partner=partner,
                             effect="latin_square"))
        # Latin square: cell (a, b) gets v[(pa[a] + pb[b]) % 6]; every row/column holds all of v
        rng = rng_stream(seed, "ad_slot*daypart", 1)
        v = rng.standard_normal(6)
        v = (v - v.mean()) / v.std() * 0.45 * s
        pa, pb = rng.permutation(6), rng.permutation(6)
        table = v[(pa[:, None] + pb[None, :]) % 6]
    # redundant copies and noise
    perm = rng_stream(seed, "user_id_copy", 1).permutation(n_user)
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
    feats.append(PlanFeature("noise_tags", FeatureKind.MULTI_CATEGORICAL, FeatureRole.NOISE, vocab=_vocab("g", 200),
                          probs=_zipf(200, 1.0), max_len=_MAX_NOISE_TAGS))
    # dense
    dense = FeatureKind.DENSE
    feats += [
        PlanFeature("price", dense, FeatureRole.INFORMATIVE, 0.5 * s, "log_linear", transform=DenseTransform.STANDARDIZE,
                 fill_value=round(float(np.exp(_PRICE_MU)), 2), nan_rate=0.02, dist="lognormal", loc=_PRICE_MU,
                 scale=_PRICE_SIGMA),
        PlanFeature("relevance_score", dense, FeatureRole.INFORMATIVE, 0.35 * s, "linear", fill_value=0.0, nan_rate=0.01,
                 dist="normal"),
        PlanFeature("engagement_score", dense, FeatureRole.INFORMATIVE, 0.25 * s, "quadratic",
                 transform=DenseTransform.STANDARDIZE, fill_value=_ENGAGEMENT_MU, nan_rate=0.01, dist="normal",
                 loc=_ENGAGEMENT_MU, scale=_ENGAGEMENT_SIGMA),
    ][:n_dense_informative]
    if n_dense_informative >= 1:  # price
        feats.append(PlanFeature("price_cents", dense, FeatureRole.REDUNDANT, transform=DenseTransform.STANDARDIZE,
                              fill_value=round(float(np.exp(_PRICE_MU)), 2) * 100, source="price"))
    for k in range(n_noise_dense):
        name = "noise_dense" if k == 0 else f"noise_dense_{k + 1}"
        if k % 2 == 0:
            feats.append(PlanFeature(name, dense, FeatureRole.NOISE, nan_rate=0.01, dist="normal"))
        else:
            feats.append(PlanFeature(name, dense, FeatureRole.NOISE, transform=DenseTransform.STANDARDIZE,
                                  fill_value=10.0, nan_rate=0.01, dist="exponential", scale=10.0))
    return _Plan(feats, table, perm)


def plan_for(config: SyntheticConfig) -> _Plan:
    return _plan(config.seed, config.n_noise, config.n_noise_dense, float(config.cardinality_scale),
                 float(config.signal_scale), int(config.n_rare_flags), int(config.n_tag_fields),
                 int(config.n_dense_informative), bool(config.interaction), bool(config.near_copy))


# ---------------------------------------------------------------------------------------------
# codes (category indices / token matrices / floats) <-> frame cells, and the logit
# ---------------------------------------------------------------------------------------------
def _sample_bags(rng: np.random.Generator, n: int, f: PlanFeature) -> np.ndarray:
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


def sample_codes(config: SyntheticConfig, plan: _Plan) -> dict[str, np.ndarray]:
    n, codes = config.n_rows, {}
    for f in plan.features:
        rng = rng_stream(config.seed, f.name)
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


def parse_codes(frame: pd.DataFrame, plan: _Plan, names: list[str]) -> dict[str, np.ndarray]:
    """Codes of the features ``names`` read back from frame cells (inverse of :func:`frame_columns`)."""
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


def term_contributions(plan: _Plan, codes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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


def needed_features(plan: _Plan) -> list[str]:
    return [f.name for f in plan.features if f.effect != "none"]


def frame_columns(plan: _Plan, codes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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


def learnable_share_of(f: PlanFeature, codes: dict[str, np.ndarray], contrib: dict[str, np.ndarray]) -> float:
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


def solve_bias(logit: np.ndarray, ctr: float) -> float:
    """The b with ``mean(sigmoid(logit + b)) == ctr`` (Newton steps, clipped)."""
    b = float(np.log(ctr / (1 - ctr)) - np.median(logit))
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(logit + b)))
        gap, slope = float(p.mean() - ctr), float((p * (1 - p)).mean())
        if abs(gap) < 1e-10 or slope <= 0:
            break
        b -= float(np.clip(gap / slope, -2.0, 2.0))
    return b
