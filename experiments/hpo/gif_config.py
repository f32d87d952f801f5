"""GIF's options as one frozen config, its closed choices as enums, and its ablations as named
presets (``GIFConfig.preset("no-hia")``), built here in one place.

The presets are what ``make_sampler("gif-<preset>")`` and the HPO benchmark run:

================  ==================================================================
preset            change from the default
================  ==================================================================
``default``       none: Latin hypercube + one-at-a-time probes, elementary effects,
                  importance groups, equal budgets, 15% full-space fallback
``no-hia``        random groups, no importance assessment
``proportional``  budgets in proportion to group importance (the paper's rule)
``no-fallback``   no final full-space search
``paper``         the literal methods.md 6.2 design: Latin hypercube warm start,
                  PED-ANOVA, proportional allocation, TPE on all trials
``sg``            Sequential Grouping (GSOS): equal-size groups in importance order,
                  equal budgets, no fallback
================  ==================================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, unique
from types import MappingProxyType
from typing import Any

from optuna.importance import BaseImportanceEvaluator

__all__ = ["GIF_PRESETS", "Allocation", "GIFConfig", "GroupHistory", "Grouping", "Warmup"]


@unique
class Warmup(str, Enum):
    """How the warm start covers the space."""

    LHS_OAT = "lhs+oat"  # Latin hypercube, then one one-at-a-time probe per parameter around its best
    LHS = "lhs"  # Latin hypercube only (works for dynamic spaces and parallel workers)
    SOBOL = "sobol"  # Optuna's scrambled Sobol QMCSampler
    RANDOM = "random"  # independent uniform draws


@unique
class Grouping(str, Enum):
    """How the parameters are cut into groups."""

    IMPORTANCE = "importance"  # importance order, cut at the cumulative mass points (group_mass)
    EQUAL = "equal"  # importance order, equal sizes (Sequential Grouping)
    RANDOM = "random"  # no importance assessment: shuffled parameters, equal sizes


@unique
class Allocation(str, Enum):
    """How the group phases share the budget."""

    UNIFORM = "uniform"  # equal budgets
    PROPORTIONAL = "proportional"  # in proportion to group importance (the paper's rule)


@unique
class GroupHistory(str, Enum):
    """The trials TPE conditions on in a group phase."""

    PHASE = "phase"  # the phase's own trials plus the incumbent
    ALL = "all"  # every trial so far


_ENUMS: dict[str, type[Enum]] = {
    "warmup": Warmup,
    "grouping": Grouping,
    "allocation": Allocation,
    "group_history": GroupHistory,
}


@dataclass(frozen=True)
class GIFConfig:
    """The options of :class:`~experiments.hpo.gif.GIFSampler` (everything but the budget and
    the seed).

    Args:
        n_warmup: space-filling warm-start trials (``lhs+oat``: the Latin hypercube before the
            probes; otherwise the whole warm start). Default: see the gif module docstring.
        warmup: how the warm start covers the space (:class:`Warmup`).
        evaluator: ``auto`` (``elementary-effects`` with probes, else ``ped-anova``), a
            registered importance evaluator name (``ped-anova``, ``fanova``, ``rrelieff``,
            ``mdi``, ``elementary-effects``) or an Optuna ``BaseImportanceEvaluator``.
        n_groups: at most this many groups.
        group_mass: cumulative importance at which a new group starts (``n_groups - 1`` cuts).
        grouping: how parameters are grouped (:class:`Grouping`).
        allocation: how the groups share the budget (:class:`Allocation`).
        fallback: fraction of the budget for the final full-space search (0 turns it off).
        min_group_trials: least trials a group gets.
        n_bootstrap: average the importance over this many bootstrap resamples (1 = none).
        wait_timeout: seconds to wait for unfinished warm-start trials (other workers) before
            the schedule is assessed without them. Use 0 with ask-and-tell batches.
        group_history: the trials TPE conditions on in a group phase (:class:`GroupHistory`).
        group_startup_trials: trials of a group phase (with ``group_history="phase"``) before
            its multivariate TPE model takes over; until then the group's parameters are drawn
            by univariate TPE on every trial.
    """

    n_warmup: int | None = None
    warmup: Warmup = Warmup.LHS_OAT
    evaluator: str | BaseImportanceEvaluator = "auto"
    n_groups: int = 3
    group_mass: Sequence[float] = (0.6, 0.9)
    grouping: Grouping = Grouping.IMPORTANCE
    allocation: Allocation = Allocation.UNIFORM
    fallback: float = 0.15
    min_group_trials: int = 3
    n_bootstrap: int = 1
    wait_timeout: float = 600.0
    group_history: GroupHistory = GroupHistory.PHASE
    group_startup_trials: int = 3

    def __post_init__(self) -> None:
        for name, enum in _ENUMS.items():
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, enum(value))
            except ValueError:
                raise ValueError(f"GIF: {name}={value!r} is not one of {[e.value for e in enum]}") from None
        object.__setattr__(self, "group_mass", tuple(float(m) for m in self.group_mass))
        if not 0.0 <= self.fallback < 1.0:
            raise ValueError(f"GIF: fallback must be a fraction in [0, 1), got {self.fallback}")
        cuts = self.group_mass
        if self.n_groups < 1 or len(cuts) < self.n_groups - 1 or any(not 0 < m < 1 for m in cuts):
            raise ValueError(
                f"GIF: need n_groups >= 1 and n_groups - 1 group_mass cut points in (0, 1), "
                f"got {self.n_groups}, {list(self.group_mass)}"
            )
        if self.n_warmup is not None and self.n_warmup < 1:
            raise ValueError(f"GIF: n_warmup must be at least 1, got {self.n_warmup}")
        if isinstance(self.evaluator, str) and self.evaluator != "auto":
            from experiments.hpo.importance import EvaluatorChoice

            EvaluatorChoice.resolve(self.evaluator)  # an unknown name is an error naming the known ones

    def replace(self, **changes: Any) -> GIFConfig:
        """A copy with ``changes`` applied (validated); an unknown option is an error naming the
        known ones."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"unknown GIF option(s) {unknown}; choose from {sorted(known)}")
        return dataclasses.replace(self, **changes)

    @staticmethod
    def preset(name: str) -> GIFConfig:
        """The named preset (:data:`GIF_PRESETS`); an unknown name lists the known ones."""
        if name not in GIF_PRESETS:
            raise ValueError(f"unknown GIF preset {name!r}; available: {sorted(GIF_PRESETS)}")
        return GIF_PRESETS[name]

    def describe(self) -> dict[str, Any]:
        """The options as plain values (enums as their strings, an evaluator as its class name)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key, value in out.items():
            if isinstance(value, Enum):
                out[key] = value.value
            elif isinstance(value, BaseImportanceEvaluator):
                out[key] = type(value).__name__
        out["group_mass"] = list(self.group_mass)
        return out


#: GIF and its ablations, by preset name (see the module docstring)
GIF_PRESETS: Mapping[str, GIFConfig] = MappingProxyType(
    {
        "default": GIFConfig(),
        "no-hia": GIFConfig(grouping=Grouping.RANDOM),
        "proportional": GIFConfig(allocation=Allocation.PROPORTIONAL),
        "no-fallback": GIFConfig(fallback=0.0),
        "paper": GIFConfig(
            warmup=Warmup.LHS,
            evaluator="ped-anova",
            allocation=Allocation.PROPORTIONAL,
            group_history=GroupHistory.ALL,
        ),
        "sg": GIFConfig(grouping=Grouping.EQUAL, allocation=Allocation.UNIFORM, fallback=0.0),
    }
)
