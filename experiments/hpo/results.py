"""What ``salience tune`` leaves behind: :class:`TuneResult`, ``best_config.yaml``,
``trials.csv`` and ``summary.json``."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from experiments.hpo.fit_config import set_nested
from experiments.hpo.space import SearchSpace, backbone_spec
from experiments.hpo.storage import shown_url

__all__ = ["TuneResult", "best_trial", "write_best_config", "write_outputs"]


@dataclass(frozen=True)
class TuneResult:
    """The outcome of :func:`~experiments.hpo.tune.tune`.

    Args:
        study_name: the study.
        storage: its storage URL.
        best_value: best validation AUC (None when no trial completed).
        best_params: its hyperparameters.
        best_config_path: the written best config (None when no trial completed).
        n_complete: completed trials.
        n_pruned: pruned trials.
        n_failed: failed trials.
        values: value of every trial by number (None unless complete).
        best_trial: number of the best trial.
        output_dir: folder of ``trials.csv`` and ``summary.json``.
        parent_run_id: the study's MLflow parent run.
    """

    study_name: str
    storage: str
    best_value: float | None
    best_params: dict[str, Any]
    best_config_path: str | None
    n_complete: int
    n_pruned: int
    n_failed: int
    values: list[float | None] = field(default_factory=list)
    best_trial: int | None = None
    output_dir: str = ""
    parent_run_id: str | None = None

    @classmethod
    def of(
        cls,
        study_name: str,
        storage: str,
        trials: Sequence[FrozenTrial],
        best_config_path: Path | None,
        output_dir: Path,
        parent_run_id: str | None,
    ) -> TuneResult:
        """The result summarising the study's ``trials``."""
        best = best_trial(trials)
        return cls(
            study_name=study_name,
            storage=storage,
            best_value=float(best.value) if best is not None else None,  # type: ignore[arg-type]
            best_params=dict(best.params) if best is not None else {},
            best_config_path=str(best_config_path) if best_config_path is not None else None,
            n_complete=_count(trials, TrialState.COMPLETE),
            n_pruned=_count(trials, TrialState.PRUNED),
            n_failed=_count(trials, TrialState.FAIL),
            values=[
                float(t.value) if t.state == TrialState.COMPLETE else None  # type: ignore[arg-type]
                for t in trials
            ],
            best_trial=best.number if best is not None else None,
            output_dir=str(output_dir),
            parent_run_id=parent_run_id,
        )

    def table(self) -> str:
        """A short text summary: counts, best value and the best hyperparameters."""
        lines = [
            f"study {self.study_name} ({shown_url(self.storage)})",
            f"trials: {self.n_complete} complete, {self.n_pruned} pruned, {self.n_failed} failed",
        ]
        if self.best_value is None:
            lines.append("no trial completed: no best config")
            return "\n".join(lines)
        lines.append(f"best val_auc {self.best_value:.4f} (trial {self.best_trial})")
        width = max(len(k) for k in self.best_params) if self.best_params else 0
        lines.append(f"  {'param':<{width}}  value")
        for k, v in self.best_params.items():
            shown = f"{v:.4g}" if isinstance(v, float) else str(v)
            lines.append(f"  {k:<{width}}  {shown}")
        lines.append(f"best config: {self.best_config_path}")
        return "\n".join(lines)


def best_trial(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The completed trial with the highest value (None when none completed)."""
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    return max(complete, key=lambda t: float(t.value)) if complete else None  # type: ignore[arg-type]


def _count(trials: Sequence[FrozenTrial], state: TrialState) -> int:
    return sum(t.state == state for t in trials)


def write_best_config(
    config: Mapping[str, Any], space: SearchSpace, params: Mapping[str, Any], path: Path, header: str = ""
) -> Path:
    """The config with the tuned hyperparameters applied, as YAML at ``path``."""
    import yaml

    from recsys.io import atomic_write_text

    best = copy.deepcopy(dict(config))
    _, base_args = backbone_spec(best)
    for key, value in space.config_updates(params, base_args).items():
        set_nested(best, key, value)
    atomic_write_text(path, header + yaml.safe_dump(best, sort_keys=False))
    return path


def write_outputs(study: optuna.Study, result: TuneResult, space: SearchSpace, out_dir: Path) -> None:
    """``trials.csv`` (every trial) and ``summary.json`` (the result and the search space)."""
    from recsys.io import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    frame = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "duration"))
    atomic_write_text(out_dir / "trials.csv", frame.to_csv(index=False))
    summary = asdict(result) | {
        "storage": shown_url(result.storage),
        "space": {
            p.name: {"distribution": optuna.distributions.distribution_to_json(p.distribution), "help": p.help}
            for p in space.params
        },
    }
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2, default=str))
