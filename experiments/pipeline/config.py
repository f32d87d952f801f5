"""The typed config of ``salience pipeline``: one YAML file, one dataclass per stage.

Example (``experiments/configs/pipeline/frappe.yaml``)::

    name: frappe
    model_config: ../frappe_dcnv2.yaml     # the original model (relative to this file)
    overrides: ["--trainer.max_epochs=30"] # every fit of the pipeline
    search_overrides: ["--trainer.max_epochs=4"]  # the fits inside the search stages
    selection: {method: leap, ks: [3, 4, 5, 6, 7, 8], tolerance: 0.002}
    dims: {method: dnis, budget: 0.5}
    tuning: {sampler: gif, n_trials: 12, max_epochs: 4}

Every key has a default except ``model_config``; an unknown key is an error naming it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CompareConfig",
    "CompressConfig",
    "DimsConfig",
    "PipelineConfig",
    "PipelineConfigError",
    "QualityConfig",
    "ScreeningConfig",
    "SelectionConfig",
    "TuningConfig",
]


class PipelineConfigError(ValueError):
    """A pipeline config that cannot run; the message names the file and the key."""


@dataclass
class QualityConfig:
    """Data-quality gates: features with any of ``drop_flags`` are dropped before ranking.

    Args:
        drop_flags: flags of :class:`selection.QualityReport` that drop a feature
            (``missing``, ``constant``, ``near_constant``, ``leakage``, ``below_noise``).
    """

    drop_flags: list[str] = field(default_factory=lambda: ["constant", "leakage"])


@dataclass
class ScreeningConfig:
    """OutRank screening of the features that passed the quality gates.

    Args:
        enabled: run it (off: every feature that passed the gates goes on to selection).
        drop_below_noise: drop features scoring below the noise control of their cardinality.
        max_features: keep at most this many features by OutRank rank (None: no cap).
        options: :class:`selection.OutRank` options.
    """

    enabled: bool = True
    drop_below_noise: bool = True
    max_features: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class SelectionConfig:
    """Learned selection: rank, draw the selection curve, keep the smallest k within tolerance.

    Args:
        method: an importance method (``leap``, ``permutation``, ``outrank``).
        options: its options.
        ks: the k grid of the curve (``"all"``: 1, 2, 4, ... up to the screened count).
        random_seeds: random rankings drawn on the same ks.
        tolerance: keep the smallest k whose test AUC is within this of the all-feature model.
    """

    method: str = "leap"
    options: dict[str, Any] = field(default_factory=dict)
    ks: list[int] | str = "all"
    random_seeds: list[int] = field(default_factory=lambda: [0])
    tolerance: float = 0.002


@dataclass
class DimsConfig:
    """Dimension search on the kept features.

    Args:
        enabled: run it (off: the kept features keep the model config's dims).
        method: a dimension search (``dnis``, ``mde``, ``ihas``, ``uniform``).
        budget: embedding parameters allowed, as a fraction of the uniform-``uniform_dim``
            model of the kept features.
        uniform_dim: the reference width of the budget.
        options: the search's options.
    """

    enabled: bool = True
    method: str = "dnis"
    budget: float = 0.5
    uniform_dim: int = 16
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TuningConfig:
    """Hyperparameter search of the reduced model (``salience tune``).

    Args:
        enabled: run it (off: the reduced model keeps the config's hyperparameters).
        sampler: ``gif``, ``tpe`` or ``random``.
        n_trials: trial budget.
        max_epochs: epochs per trial.
        limit_train_batches: training batches (int) or fraction per epoch and trial.
        fixed: hyperparameters held fixed (``embedding_dim`` is always fixed when a dimension
            plan sets the dims).
        overrides: extra ``salience fit`` overrides of the trials.
    """

    enabled: bool = True
    sampler: str = "gif"
    n_trials: int = 12
    max_epochs: int = 2
    limit_train_batches: float | None = None
    fixed: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)


@dataclass
class CompareConfig:
    """The final comparison of the original and the final model.

    Args:
        auc_tolerance: the final model should be within this test AUC of the original, judged at the
            far end of the 95% interval of the paired difference on the same test rows (DeLong).
        parity_tolerance: largest allowed |eager - exported| of either export.
        latency_batches: batch sizes of the exported-model latency.
        latency_repeats: timed calls per batch size (after warm-up).
    """

    auc_tolerance: float = 0.002
    parity_tolerance: float = 1e-5
    latency_batches: list[int] = field(default_factory=lambda: [1, 1024])
    latency_repeats: int = 30


@dataclass
class CompressConfig:
    """The optional compression step after the final fit (``salience compress``'s search).

    Args:
        enabled: run it (off by default).
        auc_tolerance: validation AUC the quantized final model may lose against its fp32 self;
            the per-table precision search goes as far as this allows.
        budget: also stop once the embedding bytes fit this (``0.1x`` of the uniform-16 fp32
            bytes, or ``2MB``); None: only the tolerance.
        eval_rows: validation rows each candidate is scored on (a seeded sample; every row when
            the split has fewer).
    """

    enabled: bool = False
    auc_tolerance: float = 0.001
    budget: str | None = None
    eval_rows: int = 200_000

    def __post_init__(self) -> None:
        if not self.auc_tolerance >= 0:
            raise PipelineConfigError(f"compress.auc_tolerance: must be >= 0, got {self.auc_tolerance}")
        if self.eval_rows < 1:
            raise PipelineConfigError(f"compress.eval_rows: must be >= 1, got {self.eval_rows}")
        if self.budget is not None:
            from embeddings.compression.precision import parse_budget

            try:
                parse_budget(str(self.budget), 1)
            except ValueError:
                raise PipelineConfigError(f"compress.budget: expected a fraction like 0.1x or a size like 2MB, "
                                          f"got {self.budget!r}") from None


@dataclass
class PipelineConfig:
    """The whole pipeline.

    Args:
        model_config: the ``salience fit`` config of the original model.
        name: pipeline name (the output folder and MLflow run names).
        output: output folder (default ``runs/pipeline/<name>``).
        seed: seed of the ranking, search and tuning stages.
        overrides: ``salience fit`` overrides of every fit (data size, trainer settings).
        search_overrides: further overrides of the fits inside quality, screening, selection
            and dims (cheaper settings than the final fits).
        final_overrides: further overrides of the original and the final fit.
        keep_search_checkpoints: keep the checkpoints of the search stages' fits (by default
            each is deleted once its fit is tested: the stages keep their metrics, and on a
            large vocabulary every fit's three checkpoint files take 3x its tables).
        quality, screening, selection, dims, tuning, compare: the stages.
        compress: the optional quantization of the final model (its embedding precision per table).
        source: the YAML file the config came from (set by :meth:`load`).
    """

    model_config: str
    name: str = "pipeline"
    output: str | None = None
    seed: int = 0
    overrides: list[str] = field(default_factory=list)
    search_overrides: list[str] = field(default_factory=list)
    final_overrides: list[str] = field(default_factory=list)
    keep_search_checkpoints: bool = False
    quality: QualityConfig = field(default_factory=QualityConfig)
    screening: ScreeningConfig = field(default_factory=ScreeningConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    dims: DimsConfig = field(default_factory=DimsConfig)
    tuning: TuningConfig = field(default_factory=TuningConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    compress: CompressConfig = field(default_factory=CompressConfig)
    source: str = ""

    @property
    def output_dir(self) -> Path:
        return Path(self.output or Path("runs") / "pipeline" / self.name)

    @property
    def model_config_path(self) -> Path:
        """``model_config``, relative paths taken from the pipeline file's folder."""
        path = Path(self.model_config)
        if not path.is_absolute() and self.source:
            path = Path(self.source).parent / path
        return path

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "pipeline config") -> PipelineConfig:
        """Build from a mapping; unknown keys and wrong types raise :class:`PipelineConfigError`."""
        config = _build(cls, data, source, "")
        config.source = source if Path(source).suffix in (".yaml", ".yml") else ""
        if not config.model_config_path.is_file():
            raise PipelineConfigError(f"{source}: model_config: file not found: {config.model_config_path}")
        return config

    @classmethod
    def load(cls, path: str | Path) -> PipelineConfig:
        """Read a pipeline file (YAML; JSON for ``.json``); every error is a :class:`PipelineConfigError`."""
        from recsys.artifacts import read_artifact

        path = Path(path)
        if not path.is_file():
            raise PipelineConfigError(f"pipeline config not found: {path}")
        return cls.from_dict(read_artifact(path, "pipeline config", PipelineConfigError, default_format="yaml"), str(path))

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` atomically (YAML; JSON for ``.json``); returns the path."""
        from recsys.artifacts import plain, write_artifact

        return write_artifact(path, plain(self.to_dict()), default_format="yaml")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("source")
        return out

    def fingerprint(self) -> str:
        """Hash of the settings and the model config's content: a resumed pipeline must match."""
        settings = {k: v for k, v in self.to_dict().items() if k != "output"}
        if settings["compress"] == dataclasses.asdict(CompressConfig()):  # added later: off keeps older folders resumable
            settings.pop("compress")
        payload = json.dumps(settings, sort_keys=True, default=str)
        payload += self.model_config_path.read_text(encoding="utf-8")
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def _build(cls: type, data: Mapping[str, Any], source: str, prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise PipelineConfigError(f"{source}: {prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise PipelineConfigError(f"{source}: unknown key(s) {[prefix + k for k in unknown]}; allowed: {sorted(fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        f = fields[name]
        key = prefix + name
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            kwargs[name] = _build(type(default), value or {}, source, f"{key}.")
        else:
            kwargs[name] = _checked(value, default, source, key)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required key is missing
        raise PipelineConfigError(f"{source}: {prefix or ''}{e}") from None
    except PipelineConfigError as e:  # a section's own check (it names the key)
        raise PipelineConfigError(f"{source}: {e}") from None


def _checked(value: Any, default: Any, source: str, key: str) -> Any:
    """``value`` when its type agrees with the default's (None and int-for-float allowed)."""
    if value is None or default is None or default is dataclasses.MISSING:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, (str, list)) if key.endswith(".ks") else isinstance(value, str)
    elif isinstance(default, list):
        ok = isinstance(value, list)
    elif isinstance(default, dict):
        ok = isinstance(value, dict)
    else:
        ok = True
    if not ok:
        raise PipelineConfigError(f"{source}: {key}: expected {type(default).__name__}, got {value!r}")
    return float(value) if isinstance(default, float) else value
