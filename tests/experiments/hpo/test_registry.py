"""Samplers, pruners and importance evaluators are chosen by name from registries: a sampler
registered here (one class) runs by name on a synthetic problem and in ``salience tune``; the
GIF ablations are named presets of one frozen config."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler

from experiments.hpo import GIFConfig, GIFSampler, SamplerChoice, SequentialGroupingSampler, make_sampler
from experiments.hpo.gif_config import GIF_PRESETS, Allocation, GroupHistory, Grouping, Warmup
from experiments.hpo.importance import make_evaluator
from experiments.hpo.problems import analytic
from experiments.hpo.pruning import OptunaPruning, make_pruner

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

SYNTHETIC = Path(__file__).resolve().parents[3] / "experiments" / "configs" / "synthetic_dcnv2.yaml"


class CornerSampler(BaseSampler):
    """A toy sampler: every parameter at its lowest value (its first choice)."""

    def infer_relative_search_space(self, study: optuna.Study, trial: Any) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: Any, search_space: dict[str, BaseDistribution]) -> dict:
        return {}

    def sample_independent(self, study: optuna.Study, trial: Any, name: str, dist: BaseDistribution) -> Any:
        return dist.choices[0] if isinstance(dist, CategoricalDistribution) else dist.low  # type: ignore[attr-defined]


@pytest.fixture
def corner() -> Iterator[type[SamplerChoice]]:
    """``corner`` registered for the test (and unregistered after it)."""

    class Corner(SamplerChoice):
        name = "corner"

        def build(self, n_trials: int, seed: int | None = None, **options: Any) -> BaseSampler:
            return CornerSampler()

    yield Corner
    SamplerChoice._registry.pop("corner", None)


def test_a_registered_sampler_runs_by_name_on_a_synthetic_problem(corner: type[SamplerChoice]) -> None:
    import experiments.hpo as hpo

    assert "corner" in hpo.SAMPLER_NAMES
    problem = analytic("sphere", 5)
    study = optuna.create_study(direction="minimize", sampler=make_sampler("corner", n_trials=3, seed=0))
    study.optimize(problem.objective, n_trials=3)
    low = {name: d.low for name, d in study.trials[0].distributions.items()}  # type: ignore[attr-defined]
    assert all(t.params == low for t in study.trials)


def test_tune_runs_a_registered_sampler_by_name(
    corner: type[SamplerChoice], tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from experiments.cli import main
    from recsys.train.recipe import FitResult, Recipe

    fits: list[dict[str, Any]] = []

    def fake_fit(self: Recipe, **kwargs: Any) -> FitResult:
        fits.append(kwargs)
        return FitResult(task=None, datamodule=None, metrics={"best_val_auc": 0.7})  # type: ignore[arg-type]

    monkeypatch.setattr(Recipe, "fit", fake_fit)
    url = f"sqlite:///{tmp_cwd / 'o.db'}"
    code = main(["tune", "--config", str(SYNTHETIC), "--sampler", "corner", "--n-trials", "2", "--storage", url,
                 "--no-tracking"])
    assert code == 0, capsys.readouterr().err
    study = optuna.load_study(study_name="synthetic_dcnv2-corner", storage=url)
    assert study.user_attrs["sampler"] == "corner"
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert (t.params["optimizer"], t.params["learning_rate"], t.params["cross_layers"]) == ("adam", 1e-4, 1)
    for kwargs in fits:  # each fit got its trial's pruning callback as an object
        (callback,) = kwargs["callbacks"]
        assert isinstance(callback, OptunaPruning)
    assert [f["callbacks"][0].trial_number for f in fits] == [0, 1]


def test_unknown_names_list_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown sampler 'bohb'; available: \[.*'gif'.*'tpe'"):
        make_sampler("bohb", n_trials=10)
    with pytest.raises(ValueError, match=r"unknown pruner 'hyperband'; available: \['median', 'none'\]"):
        make_pruner("hyperband")
    with pytest.raises(ValueError, match=r"unknown importance evaluator 'shap'; available: \[.*'ped-anova'"):
        make_evaluator("shap")
    with pytest.raises(ValueError, match=r"unknown GIF preset 'tiny'; available: \[.*'no-hia'"):
        GIFConfig.preset("tiny")
    with pytest.raises(ValueError, match="unknown importance evaluator 'shap'"):
        GIFConfig(evaluator="shap")


def test_gif_ablations_are_named_presets_of_one_frozen_config() -> None:
    gif = make_sampler("gif", n_trials=20)
    assert isinstance(gif, GIFSampler) and gif.config == GIFConfig() == GIF_PRESETS["default"]
    for name, preset in (("gif-no-hia", "no-hia"), ("gif-proportional", "proportional"),
                         ("gif-no-fallback", "no-fallback"), ("gif-paper", "paper")):
        sampler = make_sampler(name, n_trials=20, seed=0)
        assert isinstance(sampler, GIFSampler) and sampler.config == GIFConfig.preset(preset)
    assert GIFConfig.preset("no-hia").grouping is Grouping.RANDOM
    assert GIFConfig.preset("proportional").allocation is Allocation.PROPORTIONAL
    assert GIFConfig.preset("no-fallback").fallback == 0.0
    paper = GIFConfig.preset("paper")
    assert (paper.warmup, paper.evaluator, paper.allocation, paper.group_history) == (
        Warmup.LHS, "ped-anova", Allocation.PROPORTIONAL, GroupHistory.ALL)
    assert SequentialGroupingSampler(20).config == GIFConfig.preset("sg")
    # keyword options override a preset; strings become enum members; bad values name the option
    sampler = make_sampler("gif-no-hia", n_trials=20, allocation="proportional")
    assert isinstance(sampler, GIFSampler)
    assert sampler.config == GIFConfig(grouping=Grouping.RANDOM, allocation=Allocation.PROPORTIONAL)
    with pytest.raises(ValueError, match=r"warmup='halton' is not one of"):
        GIFSampler(20, warmup="halton")
    with pytest.raises(TypeError, match=r"unknown GIF option\(s\) \['budget'\]"):
        GIFSampler(20, budget=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        GIFConfig().fallback = 0.0  # type: ignore[misc]
    assert GIFConfig.preset("paper").describe()["warmup"] == "lhs"


# -- one contract over every registered sampler ---------------------------------------------------
def _built_in_samplers() -> list[str]:
    return [n for n in SamplerChoice.registered_names() if n != "corner"]


def _run(name: str, seed: int, n_trials: int = 24) -> optuna.Study:
    problem = analytic("rastrigin", 6)
    study = optuna.create_study(direction="minimize", sampler=make_sampler(name, n_trials=n_trials, seed=seed))
    study.optimize(problem.objective, n_trials=n_trials)
    return study


@pytest.mark.parametrize("name", _built_in_samplers())
def test_every_sampler_is_deterministic_under_a_seed_and_stays_in_the_space(name: str) -> None:
    """Generated from the registry: every sampler, run twice with one seed on one problem, draws
    the same points; another seed draws others; every point lies in its distribution; the study
    completes every trial (no sampler error turns into a failed trial)."""
    first, again, other = _run(name, 0), _run(name, 0), _run(name, 1)
    assert [t.params for t in first.trials] == [t.params for t in again.trials]
    assert [t.params for t in first.trials] != [t.params for t in other.trials]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in first.trials) and len(first.trials) == 24
    for t in first.trials:
        for key, value in t.params.items():
            assert t.distributions[key]._contains(t.distributions[key].to_internal_repr(value)), (name, key, value)
    assert len({tuple(sorted(t.params.items())) for t in first.trials}) > 12  # it explores (no collapse)
