"""Industrial-shaped synthetic CTR data: thousands of heterogeneous, mostly-default features with
planted ground truth (the wide benchmark's and the README's wide example's data).

The shape is that of an industrial ranking model's input (methods.md §1.1): sparse statistical
scalars at their default ``0.0`` in 90-99.5% of rows, ids of every cardinality (a few values to
100k, Zipf-like), and pre-computed embedding vectors (``vector`` features of width 8-64). On top
of the noise, a planted truth:

* **signal** features: ids (a random effect per value), common scalars (linear in
  ``log1p``), rare scalars (non-default in 1% of rows, a large effect when active) and vectors
  (linear along a random unit direction), each with a planted strength: the std of its logit
  contribution;
* an **interaction pair** of two ids whose contribution is a Latin square over their values:
  either alone carries exactly no information about the label, only the pair does;
* **copies**: an exact bijective relabelling of the strongest signal id, a near copy of another
  (10% of rows redrawn), a common signal scalar times 100 and a signal vector times 2; they add
  nothing to the logit beyond their source;
* **noise**: everything else.

Feature names say the kind, never the role (``s00012`` scalar, ``id00345`` id, ``v00007``
vector), and the features are in a seeded random order. Rows are generated in chunks from
streams keyed by ``(seed, chunk)``, so a file of any size is written in bounded memory and the
same config always gives the same rows::

    config = WideConfig(n_features=1000, n_rows=50_000, seed=0)
    truth = write_wide(config, "data/wide.parquet")      # + data/wide.schema.yaml, data/wide.truth.json
    truth.signal                                          # the planted signal set
    raw = WideReader(n_features=1000, n_rows=50_000).read()   # the same rows in memory

In files, ids are integers (Parquet int64, CSV digits), scalars float32, vectors a Parquet
fixed-size list column (CSV: D columns ``v00007_0`` .. ``v00007_{D-1}``), the label ``click``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd

from recsys.data.raw import RawData, ReadReport
from recsys.data.readers.base import Reader
from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema

__all__ = ["WideConfig", "WideReader", "WideTruth", "wide_chunks", "wide_plan", "write_wide"]

LABEL = "click"
#: rows generated per chunk (the memory of a chunk is about rows x columns x 8 bytes)
CHUNK_ROWS = 8192
#: what a planted wide feature holds
WideKind = Literal["scalar", "id", "vector"]
#: what it contributes
WideRole = Literal["signal", "interaction", "copy", "near_copy", "noise"]
#: roles of the planted truth
ROLES: tuple[str, ...] = get_args(WideRole)
_VECTOR_DIMS = (8, 16, 32, 64)


@dataclass(frozen=True)
class WideConfig:
    """The layout of a wide dataset.

    Args:
        n_features: F, every feature counted once (a vector is one feature).
        n_rows: rows.
        seed: seed of the layout and of the rows.
        n_signal: planted signal features (default ``clip(F // 50, 12, 60)``).
        vector_share: share of the noise features that are vectors.
        id_share: share of the noise features that are ids (the rest are scalars).
        logit_std: std of the planted logit (the signals share it equally).
        base_ctr: the click rate the bias is solved for.
    """

    n_features: int = 1000
    n_rows: int = 50_000
    seed: int = 0
    n_signal: int | None = None
    vector_share: float = 0.05
    id_share: float = 0.3
    logit_std: float = 2.0
    base_ctr: float = 0.2

    def __post_init__(self) -> None:
        if self.n_features < 24:
            raise ValueError(f"WideConfig.n_features must be >= 24 (signals, the pair, copies and noise), got {self.n_features}")
        if self.n_rows < 100:
            raise ValueError(f"WideConfig.n_rows must be >= 100, got {self.n_rows}")
        if not (0 <= self.vector_share <= 1 and 0 <= self.id_share <= 1 and self.vector_share + self.id_share <= 1):
            raise ValueError("WideConfig: vector_share and id_share must be in [0, 1] and sum to at most 1")
        if self.signals + 6 > self.n_features:
            raise ValueError(f"WideConfig: {self.signals} signals, a pair and 4 copies need more than {self.n_features} features")

    @property
    def signals(self) -> int:
        return self.n_signal if self.n_signal is not None else int(np.clip(self.n_features // 50, 12, 60))


@dataclass
class _Feature:
    """One planted feature (the generator's own description; :class:`WideTruth` is the public one)."""

    name: str
    kind: WideKind
    role: WideRole
    strength: float = 0.0
    cardinality: int = 0  # ids
    dim: int = 1  # vectors
    default_rate: float = 0.0  # scalars: share of rows at 0.0
    rare: bool = False  # a rare signal scalar: 1% active, a large effect
    source: str | None = None  # copies: the name of the copied feature
    index: int = 0  # the stream of its values
    copies: _Feature | None = None  # copies: the copied feature (while the plan is built)


@dataclass
class WideTruth:
    """The planted truth of a wide dataset.

    Attributes:
        config: the generator config.
        roles: feature -> role (``signal``, ``interaction``, ``copy``, ``near_copy``, ``noise``).
        strengths: feature -> planted std of its logit contribution (0 beyond the signals; the
            pair's members share its strength).
        sources: copy -> the feature it copies.
        widths: feature -> input dimensions (1 scalar, embedding dim of an id, D of a vector).
        kinds: feature -> ``dense``, ``categorical`` or ``vector``.
    """

    config: WideConfig
    roles: dict[str, str]
    strengths: dict[str, float]
    sources: dict[str, str]
    widths: dict[str, int]
    kinds: dict[str, str]

    def names(self, *roles: str) -> list[str]:
        return [f for f, r in self.roles.items() if r in roles]

    @property
    def signal(self) -> list[str]:
        """The features whose loss loses the label's information: the signals and the pair."""
        return self.names("signal", "interaction")

    def to_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "roles": self.roles, "strengths": self.strengths,
                "sources": self.sources, "widths": self.widths, "kinds": self.kinds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WideTruth:
        return cls(WideConfig(**data["config"]), dict(data["roles"]), dict(data["strengths"]), dict(data["sources"]),
                   {k: int(v) for k, v in data["widths"].items()}, dict(data["kinds"]))

    def save(self, path: str | Path) -> None:
        from recsys.io import atomic_write_json

        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> WideTruth:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _rng(seed: int, *tags: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x57D3, *tags])


def _dim_for(cardinality: int) -> int:
    """Embedding width by number of values (4 up to 100, 8 up to 10k, 16 beyond)."""
    return 4 if cardinality <= 100 else 8 if cardinality <= 10_000 else 16


@dataclass
class WidePlan:
    """Features in file order, effect tables and the bias: what every chunk is generated from."""

    config: WideConfig
    features: list[_Feature]
    effects: dict[str, np.ndarray] = field(default_factory=dict)  # id signal -> effect per value
    directions: dict[str, np.ndarray] = field(default_factory=dict)  # vector signal -> unit direction
    relabel: dict[str, np.ndarray] = field(default_factory=dict)  # exact id copy -> value map
    latin: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bias: float = 0.0

    def __getitem__(self, name: str) -> _Feature:
        return self._by_name[name]

    def __post_init__(self) -> None:
        self._by_name = {f.name: f for f in self.features}

    def schema(self) -> Schema:
        specs = []
        for f in self.features:
            if f.kind == "id":
                specs.append(FeatureSpec(f.name, FeatureKind.CATEGORICAL, embedding_dim=_dim_for(f.cardinality)))
            elif f.kind == "vector":
                specs.append(FeatureSpec(f.name, FeatureKind.VECTOR, dim=f.dim))
            else:
                specs.append(FeatureSpec(f.name, FeatureKind.DENSE, transform=DenseTransform.LOG1P))
        return Schema(tuple(specs), label=LABEL, name=f"wide{self.config.n_features}")

    def truth(self) -> WideTruth:
        schema = self.schema()
        return WideTruth(
            config=self.config,
            roles={f.name: f.role for f in self.features},
            strengths={f.name: f.strength for f in self.features},
            sources={f.name: f.source for f in self.features if f.source is not None},
            widths={s.name: s.width for s in schema.features},
            kinds={s.name: s.kind.value for s in schema.features},
        )


def wide_plan(config: WideConfig) -> WidePlan:
    """The features, effects and bias of ``config`` (deterministic in its seed)."""
    rng = _rng(config.seed, 0)
    n_sig = config.signals
    per = config.logit_std / math.sqrt(n_sig + 1)  # the pair counts as one more signal
    feats: list[_Feature] = []

    def add(kind: WideKind, role: WideRole, **kw: Any) -> _Feature:
        f = _Feature(name="", kind=kind, role=role, index=len(feats), **kw)
        feats.append(f)
        return f

    def id_card() -> int:
        return int(round(10 ** rng.uniform(1.0, 3.5)))  # 10 .. 3k values: learnable from tens of thousands of rows

    # signals: ids 35%, common scalars 20%, rare scalars 15%, vectors the rest
    n_ids, n_common, n_rare = round(0.35 * n_sig), round(0.2 * n_sig), round(0.15 * n_sig)
    n_vec = n_sig - n_ids - n_common - n_rare
    strengths = per * rng.uniform(0.7, 1.3, n_sig)
    k = 0
    for _ in range(n_ids):
        add("id", "signal", strength=float(strengths[k]), cardinality=id_card())
        k += 1
    for _ in range(n_common):
        add("scalar", "signal", strength=float(strengths[k]), default_rate=float(rng.uniform(0.3, 0.7)))
        k += 1
    for _ in range(n_rare):
        add("scalar", "signal", strength=float(strengths[k]), default_rate=0.99, rare=True)
        k += 1
    for _ in range(n_vec):
        add("vector", "signal", strength=float(strengths[k]), dim=int(rng.choice(_VECTOR_DIMS)))
        k += 1
    ids = [f for f in feats if f.kind == "id"]
    for _ in range(2):
        add("id", "interaction", strength=per, cardinality=6)
    strongest = max(ids, key=lambda f: f.strength)
    other = next(f for f in ids if f is not strongest)
    common = next(f for f in feats if f.kind == "scalar" and not f.rare)
    vector = next(f for f in feats if f.kind == "vector")
    add("id", "copy", cardinality=strongest.cardinality, copies=strongest)
    add("id", "near_copy", cardinality=other.cardinality, copies=other)
    add("scalar", "copy", default_rate=common.default_rate, copies=common)
    add("vector", "copy", dim=vector.dim, copies=vector)
    # noise: vectors, ids (2 .. 100k values: ID-like at this many rows), sparse scalars
    n_noise = config.n_features - len(feats)
    n_nv = int(round(config.vector_share * n_noise))
    n_ni = int(round(config.id_share * n_noise))
    for _ in range(n_nv):
        add("vector", "noise", dim=int(rng.choice(_VECTOR_DIMS)))
    for _ in range(n_ni):
        add("id", "noise", cardinality=int(round(10 ** rng.uniform(0.3, 5.0))))
    for _ in range(n_noise - n_nv - n_ni):
        add("scalar", "noise", default_rate=float(rng.uniform(0.90, 0.995)))
    feats = [feats[i] for i in rng.permutation(len(feats))]
    for i, f in enumerate(feats):  # names follow the file order, never the role
        f.name = f"{ {'scalar': 's', 'id': 'id', 'vector': 'v'}[f.kind] }{i:05d}"
    for f in feats:
        if f.copies is not None:
            f.source, f.copies = f.copies.name, None
    plan = WidePlan(config, feats)
    for f in feats:
        if f.role == "signal" and f.kind == "id":
            probs = _id_probs(f.cardinality)
            e = rng.standard_normal(f.cardinality)
            e -= probs @ e
            plan.effects[f.name] = e * f.strength / math.sqrt(max(float(probs @ (e * e)), 1e-12))
        elif f.role == "signal" and f.kind == "vector":
            d = rng.standard_normal(f.dim)
            plan.directions[f.name] = d / np.linalg.norm(d)
        elif f.role == "copy" and f.kind == "id":
            plan.relabel[f.name] = rng.permutation(f.cardinality)
    latin = rng.standard_normal(6)
    plan.latin = (latin - latin.mean()) / latin.std()
    pilot = _logit(plan, _generate(plan, 0, 20_000, pilot=True))
    plan.bias = _solve_bias(pilot, config.base_ctr)
    return plan


def _id_probs(card: int) -> np.ndarray:
    """Value probabilities of an id under :func:`_draw_ids`: ``log((k+2)/(k+1)) / log(card+1)``."""
    return np.diff(np.log(np.arange(1, card + 2, dtype=np.float64))) / math.log(card + 1)


def _draw_ids(u: np.ndarray, card: int) -> np.ndarray:
    """Ids in ``0..card-1`` from uniforms: ``floor((card + 1)^u) - 1`` (P(k) ∝ log((k+2)/(k+1)))."""
    return np.minimum(np.floor(np.exp(u * math.log(card + 1))).astype(np.int64) - 1, card - 1)


def _generate(plan: WidePlan, chunk: int, n: int, pilot: bool = False) -> dict[str, np.ndarray]:
    """Values of every feature for ``n`` rows of chunk ``chunk`` (ids int64, scalars float32,
    vectors n x D float32), from streams keyed by (seed, chunk, feature)."""
    seed = plan.config.seed
    tag = 1_000_000 if pilot else 0
    out: dict[str, np.ndarray] = {}
    by_name = {f.name: f for f in plan.features}
    for f in plan.features:
        if f.source is not None:
            continue  # copies after their sources
        rng = _rng(seed, 1, tag + chunk, f.index)
        if f.kind == "id":
            out[f.name] = rng.integers(0, f.cardinality, n) if f.role == "interaction" else _draw_ids(rng.random(n), f.cardinality)
        elif f.kind == "vector":
            out[f.name] = rng.standard_normal((n, f.dim)).astype(np.float32)
        else:
            active = rng.random(n) >= f.default_rate
            values = np.zeros(n, dtype=np.float32)
            values[active] = rng.lognormal(1.0, 1.0, int(active.sum())).astype(np.float32)
            out[f.name] = values
    for f in plan.features:
        if f.source is None:
            continue
        src = out[f.source]
        if f.role == "near_copy":
            rng = _rng(seed, 2, tag + chunk, f.index)
            redraw = rng.random(n) < 0.1
            values = src.copy()
            values[redraw] = _draw_ids(rng.random(int(redraw.sum())), by_name[f.source].cardinality)
            out[f.name] = values
        elif f.kind == "id":
            out[f.name] = plan.relabel[f.name][src]
        elif f.kind == "vector":
            out[f.name] = src * np.float32(2.0)
        else:
            out[f.name] = src * np.float32(100.0)
    return out


def _logit(plan: WidePlan, values: dict[str, np.ndarray]) -> np.ndarray:
    """The planted logit (without the bias) of generated rows."""
    n = len(next(iter(values.values())))
    logit = np.zeros(n)
    pair = [f.name for f in plan.features if f.role == "interaction"]
    for f in plan.features:
        if f.role != "signal":
            continue
        x = values[f.name]
        if f.kind == "id":
            logit += plan.effects[f.name][x]
        elif f.kind == "vector":
            logit += f.strength * (x.astype(np.float64) @ plan.directions[f.name])
        elif f.rare:
            active = x != 0
            logit += f.strength / math.sqrt(0.01 * 0.99) * (active - 0.01)
        else:
            z = np.log1p(x.astype(np.float64))
            logit += f.strength * (z - _LOG_MEAN[0] * (1 - f.default_rate)) / _log_std(f.default_rate)
    a, b = values[pair[0]], values[pair[1]]
    logit += plan[pair[0]].strength * plan.latin[(a + b) % len(plan.latin)]
    return logit


# mean and second moment of log1p(lognormal(1, 1)), for the common scalars' standardisation
_LOG_MEAN = (1.3726, 2.4245)


def _log_std(default_rate: float) -> float:
    p = 1 - default_rate
    mean, second = p * _LOG_MEAN[0], p * _LOG_MEAN[1]
    return math.sqrt(max(second - mean * mean, 1e-12))


def _solve_bias(logit: np.ndarray, ctr: float) -> float:
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if (1 / (1 + np.exp(-(logit + mid)))).mean() < ctr:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def wide_chunks(plan: WidePlan, rows: int = CHUNK_ROWS) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """``(values, labels)`` of the dataset's rows, ``rows`` at a time (the last chunk shorter).
    Each chunk has its own streams, so the rows depend on ``rows``: keep the default to get the
    rows of a file :func:`write_wide` wrote."""
    total = plan.config.n_rows
    for chunk, start in enumerate(range(0, total, rows)):
        n = min(rows, total - start)
        values = _generate(plan, chunk, n)
        p = 1 / (1 + np.exp(-(_logit(plan, values) + plan.bias)))
        labels = (_rng(plan.config.seed, 3, chunk).random(n) < p).astype(np.int8)
        yield values, labels


def _frame(plan: WidePlan, values: dict[str, np.ndarray], labels: np.ndarray, start: int) -> pd.DataFrame:
    """A chunk as a reader's frame: ids as strings, a vector's D prefixed float columns."""
    cols: dict[str, Any] = {}
    schema = plan.schema()
    for spec in schema.features:
        x = values[spec.name]
        if spec.is_vector:
            cols.update(zip(spec.columns, x.astype(np.float64).T))
        elif spec.is_sparse:
            cols[spec.name] = pd.array(x.astype(str), dtype="str")
        else:
            cols[spec.name] = x.astype(np.float64)
    cols[LABEL] = labels.astype(np.int8)
    frame = pd.DataFrame(cols)
    frame.index = pd.RangeIndex(start + 1, start + len(frame) + 1, name="row")
    return frame


class WideReader(Reader):
    """The wide synthetic dataset in memory (:func:`wide_plan`; see the module docstring).

    Args:
        n_features: F.
        n_rows: rows.
        seed: seed of the layout and rows.
        n_signal: planted signal features (None: the config's default).
    """

    name = "wide"

    def __init__(self, n_features: int = 1000, n_rows: int = 50_000, seed: int = 0, n_signal: int | None = None) -> None:
        self.n_features = n_features
        self.n_rows = n_rows
        self.seed = seed
        self.n_signal = n_signal
        self._plan: WidePlan | None = None
        _ = self.config  # validate early

    @property
    def config(self) -> WideConfig:
        return WideConfig(self.n_features, self.n_rows, self.seed, self.n_signal)

    def plan(self) -> WidePlan:
        if self._plan is None:
            self._plan = wide_plan(self.config)
        return self._plan

    def schema_hint(self) -> Schema:
        return self.plan().schema()

    def read(self) -> RawData:
        return pool_chunks(list(self.iter_chunks(CHUNK_ROWS)))

    def iter_chunks(self, rows: int | None = None, *, columns: Sequence[str] = ()) -> Iterator[RawData]:
        """The rows, generated :data:`CHUNK_ROWS` at a time and handed out ``rows`` at a time
        (None: sized by bytes); the rows do not depend on ``rows``."""
        from recsys.data.readers.base import check_columns

        plan = self.plan()
        schema = plan.schema()
        step = self.default_chunk_rows() if rows is None else rows
        check_columns(columns, [*schema.columns, LABEL], self.name)
        report = ReadReport(source=f"wide(n_features={self.n_features}, n_rows={self.n_rows}, seed={self.seed})")
        start = 0
        for values, labels in wide_chunks(plan):
            for lo in range(0, len(labels), step):
                hi = min(lo + step, len(labels))
                part = {k: v[lo:hi] for k, v in values.items()}
                frame = _frame(plan, part, labels[lo:hi], start)
                start += len(frame)
                report.rows_read += len(frame)
                yield RawData(frame, schema, report)

    def ground_truth(self) -> WideTruth:
        return wide_plan(self.config).truth()


def pool_chunks(chunks: list[RawData]) -> RawData:
    """Chunks of one source as one :class:`RawData`."""
    return RawData(pd.concat([c.frame for c in chunks]), chunks[0].schema, chunks[0].report)


def write_wide(config: WideConfig, path: str | Path) -> WideTruth:
    """Write the dataset to ``path`` (``.parquet`` or ``.csv``), its schema next to it
    (``<stem>.schema.yaml``) and its truth (``<stem>.truth.json``), chunk by chunk."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from recsys.io import atomic_path

    path = Path(path)
    parquet = path.suffix.lower() in (".parquet", ".pq")
    plan = wide_plan(config)
    schema = plan.schema()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        writer: Any = None
        for values, labels in wide_chunks(plan):
            arrays, names = [], []
            for spec in schema.features:
                x = values[spec.name]
                if spec.is_vector and parquet:
                    arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), spec.width))
                    names.append(spec.name)
                elif spec.is_vector:
                    arrays.extend(pa.array(col) for col in x.T)
                    names.extend(spec.columns)
                else:
                    arrays.append(pa.array(x))
                    names.append(spec.name)
            arrays.append(pa.array(labels))
            names.append(LABEL)
            table = pa.Table.from_arrays(arrays, names=names)
            if writer is None:
                writer = (pq.ParquetWriter(tmp, table.schema, compression="zstd") if parquet
                          else pacsv.CSVWriter(tmp, table.schema))
            writer.write_table(table)
        writer.close()
    stem = path.name.split(".")[0]
    schema.save(path.parent / f"{stem}.schema.yaml")
    truth = plan.truth()
    truth.save(path.parent / f"{stem}.truth.json")
    return truth


def wide_data_main(argv: Sequence[str] | None = None) -> int:
    """``salience wide-data``: write the wide dataset, its schema and its truth."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="salience wide-data",
        description="Write the wide synthetic dataset (sparse statistical scalars, ids of every cardinality, "
                    "embedding vectors; planted signals, a pure interaction pair, copies) with its schema and truth.",
    )
    parser.add_argument("--features", type=int, default=1000, help="F, features (a vector counts once; default 1000)")
    parser.add_argument("--rows", type=int, default=50_000, help="rows (default 50000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--signals", type=int, default=None, help="planted signal features (default clip(F / 50, 12, 60))")
    parser.add_argument("--output", required=True,
                        help="data file, .parquet (vectors as list columns) or .csv (vectors as prefixed columns); "
                             "<stem>.schema.yaml and <stem>.truth.json are written next to it")
    args = parser.parse_args(argv)
    try:
        config = WideConfig(args.features, args.rows, args.seed, args.signals)
    except ValueError as e:
        parser.error(str(e))
    if Path(args.output).suffix.lower() not in (".parquet", ".pq", ".csv"):
        parser.error(f"--output {args.output}: name a .parquet or .csv file")
    truth = write_wide(config, args.output)
    stem = Path(args.output).name.split(".")[0]
    folder = Path(args.output).parent
    dims = sum(truth.widths.values())
    print(f"wrote {args.output}: {args.rows:,} rows x {args.features:,} features ({dims:,} input dimensions); "
          f"schema {folder / f'{stem}.schema.yaml'}, truth {folder / f'{stem}.truth.json'} "
          f"({len(truth.signal)} planted signal features)")
    return 0
