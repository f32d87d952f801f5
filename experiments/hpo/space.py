"""The search space of ``salience tune``: typed hyperparameters and how a sampled point becomes a
``salience fit`` config.

Every backbone shares the training hyperparameters (optimizer, learning rate, dense and
embedding weight decay, embedding dim, batch size); the backbone class declares the rest itself
(:meth:`recsys.models.RankingModel.search_space`: dropout, batch norm, the deep MLP's depth, width
and shape, DCNv2's cross layers and structure), so a new backbone brings its own search space.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from recsys.config import class_path
from recsys.models import RankingModel
from recsys.models.backbone import BackboneSpec, backbone_class

__all__ = ["OPTIMIZERS", "Hyperparameter", "SearchSpace", "backbone_params", "backbone_spec", "search_space"]


@dataclass(frozen=True)
class Hyperparameter:
    """One tuned hyperparameter: its Optuna distribution and what it sets.

    Args:
        name: the Optuna parameter name.
        distribution: its Optuna distribution.
        help: one line on what it sets in the ``salience fit`` config.
    """

    name: str
    distribution: BaseDistribution
    help: str

    def suggest(self, trial: optuna.Trial) -> Any:
        d = self.distribution
        if isinstance(d, FloatDistribution):
            return trial.suggest_float(self.name, d.low, d.high, log=d.log, step=d.step)
        if isinstance(d, IntDistribution):
            return trial.suggest_int(self.name, d.low, d.high, log=d.log, step=d.step)
        if isinstance(d, CategoricalDistribution):
            return trial.suggest_categorical(self.name, d.choices)
        raise TypeError(f"unsupported distribution {type(d).__name__} of {self.name!r}")

    def plain(self, value: Any) -> Any:
        """``value`` as the plain Python type of its distribution (``int`` / ``float``)."""
        if isinstance(self.distribution, IntDistribution):
            return int(value)
        if isinstance(self.distribution, FloatDistribution):
            return float(value)
        return value


def _float(low: float, high: float, log: bool = False) -> FloatDistribution:
    return FloatDistribution(low, high, log=log)


#: the optimizers the tuner chooses between (the ``optimizer`` hyperparameter's values)
OPTIMIZERS: dict[str, str] = {
    "adam": "torch.optim.Adam",
    "adamw": "torch.optim.AdamW",
    "adagrad": "torch.optim.Adagrad",
    "sgd": "torch.optim.SGD",
}

#: what every backbone tunes: the optimizer, the embeddings and the batch
_TRAINING: tuple[Hyperparameter, ...] = (
    Hyperparameter("optimizer", CategoricalDistribution(tuple(OPTIMIZERS)), "model.optimizer (class)"),
    Hyperparameter("learning_rate", _float(1e-4, 1e-1, log=True), "model.optimizer.init_args.lr"),
    Hyperparameter("weight_decay", _float(1e-8, 1e-2, log=True), "model.optimizer.init_args.weight_decay (dense parameters)"),
    Hyperparameter("embedding_weight_decay", _float(1e-6, 1e-1, log=True), "model.embedding_weight_decay"),
    Hyperparameter("embedding_dim", CategoricalDistribution((8, 16, 32)), "data.embedding_dim (every sparse feature)"),
    Hyperparameter("batch_size", CategoricalDistribution((256, 512, 1024, 2048, 4096)), "data.batch_size"),
)


def backbone_params(backbone: type[RankingModel]) -> tuple[Hyperparameter, ...]:
    """The backbone's own hyperparameters, as its class declares them
    (:meth:`recsys.models.RankingModel.search_space`)."""
    where = f"model.backbone.init_args of {backbone.__name__}"
    return tuple(Hyperparameter(name, dist, where) for name, dist in backbone.search_space().items())


@dataclass(frozen=True)
class SearchSpace:
    """The typed search space of one backbone and how a sampled point becomes a config.

    Args:
        backbone: the backbone class (a :class:`~recsys.models.RankingModel` subclass).
        params: the hyperparameters.
        fixed: hyperparameters held at these values instead of searched.
    """

    backbone: type[RankingModel]
    params: tuple[Hyperparameter, ...]
    fixed: Mapping[str, Any] = field(default_factory=dict)

    @property
    def arch(self) -> str:
        """The backbone's name in lower case (``dcnv2``): study attributes and messages."""
        return self.backbone.__name__.lower()

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    @property
    def distributions(self) -> dict[str, BaseDistribution]:
        return {p.name: p.distribution for p in self.params}

    def __len__(self) -> int:
        return len(self.params)

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Sample every hyperparameter of the space on ``trial``."""
        return {p.name: p.suggest(trial) for p in self.params}

    def config_updates(self, params: Mapping[str, Any], base_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``{dotted config key: value}`` for a sampled point.

        ``base_args`` (the config's ``model.backbone.init_args``) are the backbone arguments the
        sampled ones are merged into; the :attr:`fixed` hyperparameters fill the ones not sampled.
        """
        params = {**self.fixed, **params}
        missing = sorted(set(self.names) - set(params))
        if missing:
            raise ValueError(f"parameters {missing} of the {self.arch} search space are missing")
        init_args = {**dict(base_args or {}), **self.backbone.tuned_args(params)}
        optimizer_args = {"lr": float(params["learning_rate"]), "weight_decay": float(params["weight_decay"])}
        return {
            "model.embedding_kernel": "plain",
            "model.optimizer": {"class_path": OPTIMIZERS[str(params["optimizer"])], "init_args": optimizer_args},
            "model.embedding_weight_decay": float(params["embedding_weight_decay"]),
            "model.backbone": {"class_path": class_path(self.backbone), "init_args": init_args},
            "data.embedding_dim": int(params["embedding_dim"]),
            "data.batch_size": int(params["batch_size"]),
        }


def search_space(backbone: BackboneSpec | None, fixed: Mapping[str, Any] | None = None) -> SearchSpace:
    """The search space of a backbone (``model.backbone``: DCNv2 13 hyperparameters, DLRM /
    DeepFM 11): the training hyperparameters plus what the backbone class declares.

    ``fixed`` holds hyperparameters taken out of the search at the given values (e.g.
    ``{"embedding_dim": 16}`` when a dimension plan sets the dims); an unknown name or a value
    outside its range is an error naming it.
    """
    cls = backbone_class(backbone)
    params = (*_TRAINING, *backbone_params(cls))
    arch = cls.__name__
    fixed = dict(fixed or {})
    known = {p.name: p for p in params}
    unknown = sorted(set(fixed) - set(known))
    if unknown:
        raise ValueError(f"fixed hyperparameters {unknown} are not in the {arch} search space {sorted(known)}")
    for name, value in fixed.items():
        dist = known[name].distribution
        try:
            inside = dist._contains(dist.to_internal_repr(value))
        except (ValueError, TypeError):
            inside = False
        if not inside:
            raise ValueError(f"fixed hyperparameter {name}={value!r} is outside its range {known[name].distribution}")
    return SearchSpace(cls, tuple(p for p in params if p.name not in fixed), fixed)


def backbone_spec(config: Mapping[str, Any]) -> tuple[type[RankingModel], dict[str, Any]]:
    """The backbone class and the ``init_args`` a ``salience fit`` config sets (``model.backbone``)."""
    spec = (config.get("model") or {}).get("backbone")
    args = dict(spec.get("init_args") or {}) if isinstance(spec, Mapping) else {}
    return backbone_class(spec), args
