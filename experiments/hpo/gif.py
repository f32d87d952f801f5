"""GIF: greedy importance-first hyperparameter search as an Optuna sampler (methods.md 6.2).

A study run with :class:`GIFSampler` spends its budget ``B`` in phases:

1. **warm start**: a Latin hypercube of ``max(5, ceil(0.05 B))`` trials, then one
   one-at-a-time probe per parameter around the best of them (that parameter moved half its
   range). When the probes do not fit in 40% of the budget, or with ``warmup="lhs"``, the warm
   start is ``n0 = max(2d, ceil(0.1 B))`` space-filling trials capped at ``B / 4`` instead;
2. **importance assessment** on the warm start: elementary effects of the probes by default,
   PED-ANOVA on a space-filling start, or fANOVA / N-RReliefF / any Optuna evaluator;
3. **grouping**: parameters sorted by importance, cut into groups at 60% and 90% of the
   cumulative importance mass;
4. **allocation**: the remaining budget, less the fallback, split over the groups equally
   (``allocation="uniform"``, the default) or in proportion to group importance;
5. **greedy schedule**: multivariate TPE over each group's parameters in turn, every other
   parameter fixed at the incumbent (the best trial so far), TPE conditioned on the phase's own
   trials plus the incumbent (its model starts after 3 of them);
6. **fallback**: the last ``ceil(0.15 B)`` trials (and any trial past ``B``) run TPE over the
   full space, conditioned on every trial so far.

Steps 1, 4 and 5 improve on the paper-derived design of methods.md 6.2 where our ablations said
so (``experiments/results/hpo.md``): the probes rank parameters far better than PED-ANOVA on
a space-filling sample, proportional allocation starved the many-parameter tail groups, and TPE
conditioned on all trials was misled by trials whose fixed parameters differed. The literal
design is ``GIFSampler(B, config=GIFConfig.preset("paper"))`` (``make_sampler("gif-paper")``).

Every decision is a function of the study's storage, never of one process's memory: a trial's
phase follows from its number and the schedule, which is computed once from the warm-start
trials and stored in the study (``gif:schedule``); each trial records ``gif:phase`` and
``gif:group`` as system attributes. Worker processes sharing one RDB storage therefore follow
one schedule, and a killed study resumes where it stopped::

    import optuna
    from experiments.hpo import GIFSampler, read_schedule

    study = optuna.create_study(sampler=GIFSampler(n_trials=200, seed=0), storage="sqlite:///optuna.db")
    study.optimize(objective, n_trials=200)
    read_schedule(study).table()   # importance, rank and group of every parameter

The options are one frozen :class:`~experiments.hpo.gif_config.GIFConfig`; the ablations
(``grouping="random"``, ``allocation="proportional"``, ``fallback=0``) and
:class:`SequentialGroupingSampler` (GSOS) are its named presets (``GIFConfig.preset("no-hia")``)
and share this one implementation.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.importance import BaseImportanceEvaluator
from optuna.samplers import BaseSampler, QMCSampler, RandomSampler, TPESampler
from optuna.search_space import intersection_search_space
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from experiments.hpo.gif_config import GIF_PRESETS, Allocation, GIFConfig, GroupHistory, Grouping, Warmup
from experiments.hpo.importance import make_evaluator, unit_encode

__all__ = [
    "GIF_PRESETS",
    "GROUP_ATTR",
    "PHASE_ATTR",
    "SCHEDULE_ATTR",
    "Allocation",
    "GIFConfig",
    "GIFSampler",
    "GroupHistory",
    "Grouping",
    "Schedule",
    "SequentialGroupingSampler",
    "Warmup",
    "read_schedule",
    "trial_phase",
]

log = logging.getLogger(__name__)

PHASE_ATTR = "gif:phase"
GROUP_ATTR = "gif:group"
SCHEDULE_ATTR = "gif:schedule"
SEED_ATTR = "gif:seed"
N_WARMUP_ATTR = "gif:warmup"
PROBES_ATTR = "gif:probes"
PROBE_ATTR = "gif:probe"

WARMUP, GROUP, FALLBACK = "warmup", "group", "fallback"


@dataclass
class Schedule:
    """The phase plan of a GIF study, fixed once the warm start is assessed.

    Attributes:
        n_warmup: warm-start trials (numbers ``0 .. n_warmup-1``).
        importance: normalised importance of every parameter, sorted descending.
        groups: parameter names of each group, in the order the groups are searched.
        budgets: trials of each group.
        n_fallback: planned full-space trials after the groups (every trial past the budget is
            a fallback trial too).
        evaluator: importance evaluator used (``none`` for random grouping).
        assessed_trials: numbers of the trials the importance was computed from.
        note: why the schedule degraded to a plain full-space search, if it did.
    """

    n_warmup: int
    importance: dict[str, float]
    groups: list[list[str]]
    budgets: list[int]
    n_fallback: int
    evaluator: str
    assessed_trials: list[int] = field(default_factory=list)
    note: str = ""

    def phase_of(self, number: int) -> tuple[str, int]:
        """``(phase, group)`` of trial ``number``; group is -1 outside group phases."""
        if number < self.n_warmup:
            return WARMUP, -1
        position = number - self.n_warmup
        for g, budget in enumerate(self.budgets):
            if position < budget:
                return GROUP, g
            position -= budget
        return FALLBACK, -1

    def group_of(self, param: str) -> int:
        """Index of the group holding ``param`` (-1 when in none)."""
        return next((g for g, names in enumerate(self.groups) if param in names), -1)

    def table(self) -> list[dict[str, Any]]:
        """One row per parameter: ``param, importance, rank, group``."""
        return [
            {"param": p, "importance": v, "rank": r + 1, "group": self.group_of(p)}
            for r, (p, v) in enumerate(self.importance.items())
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        return cls(**data)


def read_schedule(study: optuna.Study) -> Schedule | None:
    """The stored schedule of a GIF study (``None`` before its warm start is assessed, or for
    studies run by another sampler)."""
    data = study._storage.get_study_system_attrs(study._study_id).get(SCHEDULE_ATTR)
    return Schedule.from_dict(data) if data is not None else None


def trial_phase(trial: FrozenTrial) -> tuple[str | None, int]:
    """``(phase, group)`` recorded on a trial by GIF; ``(None, -1)`` for other samplers."""
    return trial.system_attrs.get(PHASE_ATTR), int(trial.system_attrs.get(GROUP_ATTR, -1))


@dataclass
class _Plan:
    phase: str
    group: int
    number: int
    space: list[str] = field(default_factory=list)  # parameters sampled jointly by TPE
    fixed: dict[str, Any] = field(default_factory=dict)  # incumbent values of the others
    start: int = 0  # first trial number of the phase
    best: int = -1  # incumbent trial number when the trial started
    probe: str | None = None  # the parameter a one-at-a-time warm-start trial moves
    random: bool = False  # a warm-start trial sampled at random
    tpe: TPESampler | None = None  # this trial's TPE, seeded from (study seed, trial number)


@dataclass
class _Warmup:
    n_warmup: int  # all warm-start trials
    n_lhs: int  # Latin-hypercube (or Sobol/random) trials first
    n_probes: int  # then one-at-a-time probes around the best of them


class GIFSampler(BaseSampler):
    """Greedy importance-first search (see the module docstring).

    Args:
        n_trials: the total budget ``B`` the schedule is planned for.
        seed: seed of the warm-start design, the grouping and TPE. Give one when several
            processes share a study (without it the first process stores a random one).
        config: the options (:class:`~experiments.hpo.gif_config.GIFConfig`; default
            ``GIFConfig()``, or a preset such as ``GIFConfig.preset("no-hia")``).
        **options: :class:`~experiments.hpo.gif_config.GIFConfig` fields overriding ``config``
            (``GIFSampler(B, allocation="proportional")``).
    """

    def __init__(
        self, n_trials: int, *, seed: int | None = None, config: GIFConfig | None = None, **options: Any
    ) -> None:
        if n_trials < 1:
            raise ValueError(f"n_trials must be at least 1, got {n_trials}")
        config = (config or GIFConfig()).replace(**options)
        self.config = config
        self.n_trials = int(n_trials)
        self.seed = seed
        self.n_warmup = None if config.n_warmup is None else min(int(config.n_warmup), self.n_trials)
        if config.n_warmup is not None and config.n_warmup > n_trials:
            log.warning(
                "n_warmup=%d exceeds the budget n_trials=%d: the whole budget is warm start", config.n_warmup, n_trials
            )
        self.warmup = config.warmup
        self.evaluator = config.evaluator
        self.n_groups = int(config.n_groups)
        self.group_mass = sorted(float(m) for m in config.group_mass)[: self.n_groups - 1]
        self.grouping = config.grouping
        self.allocation = config.allocation
        self.fallback = float(config.fallback)
        self.min_group_trials = int(config.min_group_trials)
        self.n_bootstrap = max(1, int(config.n_bootstrap))
        self.wait_timeout = float(config.wait_timeout)
        self.group_history = config.group_history
        self.group_startup_trials = int(config.group_startup_trials)
        self._plans: dict[int, _Plan] = {}
        self._schedule: Schedule | None = None
        self._warm_cache: _Warmup | None = None
        self._probe_cache: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._make_samplers(seed)

    def _make_samplers(self, seed: int | None) -> None:
        self._seed = seed
        n_startup = 10 if self.n_warmup is None else min(10, self.n_warmup)
        self._tpe = TPESampler(multivariate=True, seed=seed, constant_liar=True, n_startup_trials=n_startup)
        # a group phase conditions on its own trials: its model starts after a few of them
        self._group_tpe = TPESampler(
            multivariate=True, seed=seed, constant_liar=True, n_startup_trials=self.group_startup_trials
        )
        self._random = RandomSampler(seed=seed)
        self._qmc = QMCSampler(qmc_type="sobol", scramble=True, seed=seed) if self.warmup is Warmup.SOBOL else None

    def reseed_rng(self) -> None:
        self._tpe.reseed_rng()
        self._random.reseed_rng()

    # -- the schedule --------------------------------------------------------------------------
    @property
    def fallback_trials(self) -> int:
        return math.ceil(self.fallback * self.n_trials)

    def _study_seed(self, study: optuna.Study) -> int:
        if self._seed is not None:
            return self._seed
        attrs = study._storage.get_study_system_attrs(study._study_id)
        if SEED_ATTR not in attrs:
            entropy = cast(int, np.random.SeedSequence().entropy)  # an int when drawn from the OS
            study._storage.set_study_system_attr(study._study_id, SEED_ATTR, int(entropy % 2**31))
            attrs = study._storage.get_study_system_attrs(study._study_id)
        self._make_samplers(int(attrs[SEED_ATTR]))
        return int(attrs[SEED_ATTR])

    def _lhs_size(self) -> int:
        """Latin-hypercube trials before the one-at-a-time probes of an ``lhs+oat`` warm start."""
        return self.n_warmup if self.n_warmup is not None else max(5, math.ceil(0.05 * self.n_trials))

    def _warmup_bounds(self) -> tuple[int, int]:
        """Least ``n0`` before the number of parameters is known, and the Latin-hypercube size."""
        if self.warmup is Warmup.LHS_OAT:
            return self._lhs_size(), self._lhs_size()
        if self.n_warmup is not None:
            return self.n_warmup, self.n_warmup
        cap = max(1, self.n_trials // 4)
        return min(math.ceil(0.1 * self.n_trials), cap), cap

    def _warm(self, study: optuna.Study) -> _Warmup:
        """The warm-start layout, fixed from trial 0's parameter count (stored in the study)."""
        if self._warm_cache is not None:
            return self._warm_cache
        attrs = study._storage.get_study_system_attrs(study._study_id)
        if N_WARMUP_ATTR not in attrs:
            low, _ = self._warmup_bounds()
            if self.warmup is not Warmup.LHS_OAT and self.n_warmup is not None:
                layout = _Warmup(self.n_warmup, self.n_warmup, 0)
            else:
                done = self._wait_finished(study, [0])
                first = done[0] if done else None
                d = len(first.distributions) if first is not None else 1
                if self.warmup is Warmup.LHS_OAT and low + d <= 0.4 * self.n_trials:
                    layout = _Warmup(low + d, low, d)
                else:  # one-at-a-time probes do not fit the budget: a plain space-filling start
                    n_lhs = min(max(2 * d, math.ceil(0.1 * self.n_trials)), max(1, self.n_trials // 4))
                    oat = self.warmup is Warmup.LHS_OAT
                    layout = _Warmup(max(n_lhs, low if oat else 1), low if oat else n_lhs, 0)
            study._storage.set_study_system_attr(study._study_id, N_WARMUP_ATTR, asdict(layout))
            attrs = study._storage.get_study_system_attrs(study._study_id)
        self._warm_cache = _Warmup(**attrs[N_WARMUP_ATTR])
        return self._warm_cache

    def _probes(self, study: optuna.Study, warm: _Warmup) -> dict[str, Any]:
        """Base trial (the best Latin-hypercube trial) and parameter order of the one-at-a-time
        probes (stored in the study)."""
        if self._probe_cache is not None:
            return self._probe_cache
        attrs = study._storage.get_study_system_attrs(study._study_id)
        if PROBES_ATTR not in attrs:
            lhs = self._wait_finished(study, range(warm.n_lhs))
            names = sorted({p for t in lhs for p in t.distributions})
            best = _incumbent_of(lhs, study.direction)
            info: dict[str, Any] = {"base": -1 if best is None else best.number, "params": dict(best.params) if best else {}, "order": names}
            study._storage.set_study_system_attr(study._study_id, PROBES_ATTR, info)
            attrs = study._storage.get_study_system_attrs(study._study_id)
        self._probe_cache = dict(attrs[PROBES_ATTR])
        return self._probe_cache

    def _wait_finished(self, study: optuna.Study, numbers: Sequence[int]) -> list[FrozenTrial]:
        """The trials ``numbers`` once finished (waits for other workers' running trials)."""
        wanted = set(numbers)
        deadline = time.monotonic() + self.wait_timeout
        while True:
            trials = [t for t in study._storage.get_all_trials(study._study_id, deepcopy=False) if t.number in wanted]
            if all(t.state.is_finished() for t in trials):
                return sorted(trials, key=lambda t: t.number)
            if time.monotonic() > deadline:
                log.warning("GIF: warm-start trials still running after %.0f s; assessing without them", self.wait_timeout)
                return sorted((t for t in trials if t.state.is_finished()), key=lambda t: t.number)
            optuna.storages.fail_stale_trials(study)
            time.sleep(0.05)

    def schedule(self, study: optuna.Study) -> Schedule:
        """The study's schedule: read from storage, or assessed now and stored (first writer
        wins, so every worker uses the same one)."""
        if self._schedule is not None:
            return self._schedule
        stored = read_schedule(study)
        if stored is None:
            warm = self._warm(study)
            computed = self._assess(study, self._wait_finished(study, range(warm.n_warmup)), warm)
            if read_schedule(study) is None:
                study._storage.set_study_system_attr(study._study_id, SCHEDULE_ATTR, computed.to_dict())
            stored = read_schedule(study)
            assert stored is not None
            self._log_schedule(stored)
        self._schedule = stored
        return stored

    def _assess(self, study: optuna.Study, warm: list[FrozenTrial], layout: _Warmup) -> Schedule:
        """Importance, groups and budgets from the warm-start trials."""
        n0 = layout.n_warmup
        params: list[str] = []
        for t in warm:
            params += [p for p in t.distributions if p not in params]
        complete = [t for t in warm if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)]
        n_fb = min(self.fallback_trials, max(0, self.n_trials - n0))
        rest = max(0, self.n_trials - n0 - n_fb)
        plain = Schedule(n0, {p: 1.0 / max(len(params), 1) for p in params}, [], [], n_fb, "none", [t.number for t in complete])
        if len(params) <= 1:
            plain.note = "one parameter: GIF runs its base sampler (TPE) after the warm start"
            return plain
        if rest == 0:
            plain.note = f"no budget left for groups after {n0} warm-start and {n_fb} fallback trials"
            return plain
        seed = self._study_seed(study)
        importance: dict[str, float] | None
        if self.grouping is Grouping.RANDOM:
            order = list(np.random.default_rng(seed).permutation(params))
            importance = {p: 1.0 / len(params) for p in order}
            evaluator = "none"
        else:
            if len(complete) < 3:
                plain.note = f"only {len(complete)} finished warm-start trials with a value: no importance, full-space search"
                return plain
            evaluator = self.evaluator if isinstance(self.evaluator, str) else type(self.evaluator).__name__
            if evaluator == "auto":
                evaluator = "elementary-effects" if layout.n_probes else "ped-anova"
            importance = self._importance(study, complete, params, seed, evaluator if isinstance(self.evaluator, str) else self.evaluator)
            if importance is None:
                plain.note = "the importance assessment gave no signal (all zero): full-space search"
                plain.evaluator = evaluator
                return plain
        groups = self._group(list(importance), importance)
        weights = [sum(importance[p] for p in g) for g in groups]
        if self.allocation is Allocation.UNIFORM:
            weights = [1.0] * len(groups)
        budgets, groups = self._allocate(rest, weights, groups)
        n_fb = self.n_trials - n0 - sum(budgets)
        return Schedule(n0, importance, groups, budgets, n_fb, evaluator, [t.number for t in complete])

    def _importance(
        self, study: optuna.Study, complete: list[FrozenTrial], params: list[str], seed: int, evaluator: str | BaseImportanceEvaluator
    ) -> dict[str, float] | None:
        rng = np.random.default_rng(seed)
        total = dict.fromkeys(params, 0.0)
        for b in range(self.n_bootstrap):
            sample = complete if b == 0 else [complete[i] for i in rng.integers(0, len(complete), len(complete))]
            copy = optuna.create_study(directions=study.directions)
            copy.add_trials(sample)
            with _quiet_optuna():
                try:
                    raw = optuna.importance.get_param_importances(
                        copy, evaluator=make_evaluator(evaluator, seed=seed), normalize=False
                    )
                except (ValueError, RuntimeError) as err:  # e.g. too few distinct values
                    log.warning("GIF: importance assessment failed (%s)", err)
                    raw = {}
            values = {p: max(0.0, float(raw.get(p, 0.0))) for p in params}
            mass = sum(v for v in values.values() if math.isfinite(v))
            if mass > 0:
                for p in params:
                    total[p] += values[p] / mass if math.isfinite(values[p]) else 0.0
        mass = sum(total.values())
        if mass <= 0:
            return None
        # descending importance; ties keep the order the parameters were first suggested
        return dict(sorted(((p, v / mass) for p, v in total.items()), key=lambda kv: -kv[1]))

    def _group(self, order: list[str], importance: dict[str, float]) -> list[list[str]]:
        if self.grouping is Grouping.IMPORTANCE:
            groups: list[list[str]] = [[] for _ in range(self.n_groups)]
            cumulative = 0.0
            for p in order:
                g = sum(cumulative >= cut - 1e-12 for cut in self.group_mass)
                groups[g].append(p)
                cumulative += importance[p]
        else:  # importance order (equal) or shuffled (random) cut into equal sizes
            groups = [list(map(str, chunk)) for chunk in np.array_split(np.array(order, dtype=object), self.n_groups)]
        return [g for g in groups if g]

    def _allocate(self, total: int, weights: list[float], groups: list[list[str]]) -> tuple[list[int], list[list[str]]]:
        """``B_g = max(m_min, total * w_g)`` rounded by largest remainder; while the sum exceeds
        ``total`` the least important group is trimmed (dropped once it would fall below
        ``m_min``)."""
        mass = sum(weights)
        shares = [total * w / mass for w in weights]
        budgets = [max(self.min_group_trials, math.floor(x)) for x in shares]
        for g in sorted(range(len(shares)), key=lambda g: -(shares[g] - math.floor(shares[g]))):
            if sum(budgets) >= total:
                break
            budgets[g] += 1  # largest remainders first, so the groups use the whole budget
        groups = list(groups)
        while sum(budgets) > total:
            excess = sum(budgets) - total
            if len(budgets) == 1:
                budgets[0] = total
            elif budgets[-1] - excess >= self.min_group_trials:
                budgets[-1] -= excess
            else:
                budgets.pop()
                groups.pop()
        return budgets, groups

    def _log_schedule(self, s: Schedule) -> None:
        if s.note:
            log.info("GIF: %s", s.note)
            return
        parts = [f"group {g} ({', '.join(names)}): {b} trials" for g, (names, b) in enumerate(zip(s.groups, s.budgets))]
        log.info("GIF schedule: %d warm-start; %s; %d fallback", s.n_warmup, "; ".join(parts), s.n_fallback)

    # -- per trial ------------------------------------------------------------------------------
    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if len(study.directions) > 1:
            raise ValueError("GIFSampler supports single-objective studies only")
        self._study_seed(study)
        low, _ = self._warmup_bounds()
        if trial.number < low:
            plan = _Plan(WARMUP, -1, trial.number)
        else:
            warm = self._warm(study)
            if trial.number >= warm.n_warmup:
                plan = self._plan(study, trial.number)
            elif warm.n_probes and trial.number >= warm.n_lhs:
                plan = self._probe_plan(study, warm, trial.number)
                if plan.probe is not None:
                    study._storage.set_trial_system_attr(trial._trial_id, PROBE_ATTR, plan.probe)
            else:  # past the Latin hypercube of an lhs+oat start whose probes did not fit
                plan = _Plan(WARMUP, -1, trial.number, random=trial.number >= warm.n_lhs)
        study._storage.set_trial_system_attr(trial._trial_id, PHASE_ATTR, plan.phase)
        study._storage.set_trial_system_attr(trial._trial_id, GROUP_ATTR, plan.group)
        with self._lock:
            self._plans[trial._trial_id] = plan
        if plan.phase != WARMUP:
            plan.tpe = self._trial_tpe(study, plan)
        if plan.phase == WARMUP and self.warmup in (Warmup.SOBOL, Warmup.RANDOM):
            (self._qmc or self._random).before_trial(study, trial)
        else:
            (plan.tpe or self._tpe).before_trial(study, trial)

    def _trial_tpe(self, study: optuna.Study, plan: _Plan) -> TPESampler:
        """A TPE seeded from (study seed, trial number): worker processes share the seed, and a
        TPE seeded once would draw the same candidates for their concurrent trials (the model
        is rebuilt from storage every trial, so the generator is its only state)."""
        seed = int(np.random.SeedSequence([self._study_seed(study) % 2**32, plan.number]).generate_state(1)[0])
        template = self._group_tpe if plan.phase == GROUP and self.group_history is GroupHistory.PHASE else self._tpe
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return TPESampler(
                multivariate=True, seed=seed, constant_liar=True, n_startup_trials=template._n_startup_trials
            )

    def _plan(self, study: optuna.Study, number: int) -> _Plan:
        schedule = self.schedule(study)
        phase, group = schedule.phase_of(number)
        if phase != GROUP:  # fallback: TPE over every parameter, conditioned on every trial
            return _Plan(phase, group, number)
        best = _incumbent(study)
        names = schedule.groups[group]
        fixed = {} if best is None else {p: v for p, v in best.params.items() if p not in names}
        start = schedule.n_warmup + sum(schedule.budgets[:group])
        return _Plan(GROUP, group, number, space=list(names), fixed=fixed, start=start, best=-1 if best is None else best.number)

    def _probe_plan(self, study: optuna.Study, warm: _Warmup, number: int) -> _Plan:
        """One-at-a-time probe: the base trial with one parameter moved half its range."""
        info = self._probes(study, warm)
        j = number - warm.n_lhs
        probe = info["order"][j] if info["base"] >= 0 and j < len(info["order"]) else None
        return _Plan(WARMUP, -1, number, fixed=dict(info["params"]), probe=probe, random=probe is None)

    def _plan_of(self, trial: FrozenTrial) -> _Plan:
        with self._lock:
            plan = self._plans.get(trial._trial_id)
        if plan is None:  # a trial this process did not start (e.g. re-sampled elsewhere)
            phase, group = trial_phase(trial)
            plan = _Plan(phase or FALLBACK, group, trial.number)
        return plan

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        plan = self._plan_of(trial)
        if plan.phase == WARMUP:
            return self._qmc.infer_relative_search_space(study, trial) if self._qmc is not None else {}
        if plan.phase == GROUP:
            return {p: d for p, d in intersection_search_space(_completed(study)).items() if p in plan.space}
        return (plan.tpe or self._tpe).infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        plan = self._plan_of(trial)
        if plan.phase == WARMUP:
            return self._qmc.sample_relative(study, trial, search_space) if self._qmc is not None else {}
        if plan.phase == GROUP and self.group_history is GroupHistory.PHASE:
            view = cast(optuna.Study, _HistoryView(study, plan))  # a read-only proxy of the study
            return (plan.tpe or self._group_tpe).sample_relative(view, trial, search_space)
        return (plan.tpe or self._tpe).sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution) -> Any:
        plan = self._plan_of(trial)
        if plan.phase == WARMUP:
            if param_name in plan.fixed and _fits(plan.fixed[param_name], param_distribution):
                base = plan.fixed[param_name]
                return _moved(base, param_distribution) if param_name == plan.probe else base
            if self.warmup in (Warmup.LHS, Warmup.LHS_OAT) and not plan.random:
                _, n_strata = self._warmup_bounds()
                return _lhs_value(self._study_seed(study), param_name, trial.number, n_strata, param_distribution)
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        if plan.phase == GROUP and param_name in plan.fixed and _fits(plan.fixed[param_name], param_distribution):
            return plan.fixed[param_name]
        return (plan.tpe or self._tpe).sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        with self._lock:
            plan = self._plans.pop(trial._trial_id, None)
        (plan.tpe if plan is not None and plan.tpe is not None else self._tpe).after_trial(study, trial, state, values)


class SequentialGroupingSampler(GIFSampler):
    """Sequential Grouping (GSOS), the baseline GIF improves on: groups of equal size in
    importance order, equal budgets, no full-space fallback."""

    def __init__(
        self, n_trials: int, *, seed: int | None = None, config: GIFConfig | None = None, **options: Any
    ) -> None:
        super().__init__(n_trials, seed=seed, config=config or GIFConfig.preset("sg"), **options)


class _HistoryView:
    """The study as TPE sees it in a group phase with ``group_history="phase"``: the incumbent
    plus the phase's own trials (where the other parameters were fixed)."""

    def __init__(self, study: optuna.Study, plan: _Plan) -> None:
        self._study, self._plan = study, plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _keep(self, t: FrozenTrial) -> bool:
        return t.number >= self._plan.start or t.number == self._plan.best

    def _get_trials(self, *args: Any, **kwargs: Any) -> list[FrozenTrial]:
        return [t for t in self._study._get_trials(*args, **kwargs) if self._keep(t)]

    def get_trials(self, *args: Any, **kwargs: Any) -> list[FrozenTrial]:
        return [t for t in self._study.get_trials(*args, **kwargs) if self._keep(t)]


def _completed(study: optuna.Study) -> list[FrozenTrial]:
    return study._get_trials(deepcopy=False, states=(TrialState.COMPLETE,), use_cache=True)


def _incumbent(study: optuna.Study) -> FrozenTrial | None:
    """The best finished trial with a finite value (``None`` before there is one)."""
    return _incumbent_of(_completed(study), study.direction)


def _incumbent_of(trials: Sequence[FrozenTrial], direction: StudyDirection) -> FrozenTrial | None:
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)]
    if not done:
        return None
    sign = 1.0 if direction == StudyDirection.MINIMIZE else -1.0
    return min(done, key=lambda t: (sign * cast(float, t.value), t.number))


def _fits(value: Any, dist: BaseDistribution) -> bool:
    """Whether ``value`` is a valid value of ``dist`` (an incumbent's value after the space changed)."""
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def _moved(value: Any, dist: BaseDistribution) -> Any:
    """``value`` moved half the range of ``dist`` (the other half of a categorical's choices)."""
    if isinstance(dist, CategoricalDistribution):
        k = len(dist.choices)
        return dist.choices[(int(dist.to_internal_repr(value)) + max(1, k // 2)) % k]
    (u,), _ = unit_encode([value], dist)
    return _from_unit(u + 0.5 if u < 0.5 else u - 0.5, dist)


def _lhs_value(seed: int, name: str, number: int, n_strata: int, dist: BaseDistribution) -> Any:
    """Value of ``name`` in warm-start trial ``number``: stratum ``perm[number]`` of a seeded
    permutation of ``n_strata`` strata per parameter (a Latin hypercube when all ``n_strata``
    trials are run), jittered inside the stratum; deterministic in (seed, name, number)."""
    key = zlib.crc32(name.encode())
    stratum = np.random.default_rng([seed, key]).permutation(n_strata)[number % n_strata]
    u = (stratum + np.random.default_rng([seed, key, number]).random()) / n_strata
    return _from_unit(float(u), dist)


def _from_unit(u: float, dist: BaseDistribution) -> Any:
    """Map ``u`` in ``[0, 1)`` to a value of ``dist`` (log scale where the distribution is)."""
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[min(int(u * len(dist.choices)), len(dist.choices) - 1)]
    assert isinstance(dist, (FloatDistribution, IntDistribution))
    low, high = float(dist.low), float(dist.high)
    if dist.log:
        value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    else:
        value = low + u * (high - low)
    step = dist.step
    if isinstance(dist, IntDistribution):
        step = step or 1
        value = low + round((value - low) / step) * step
        return int(min(max(value, low), high))
    if step is not None:
        value = low + round((value - low) / step) * step
    return float(min(max(value, low), high))


class _quiet_optuna:
    """Optuna's importance warnings (too few trials, equal quantiles) off while assessing."""

    def __enter__(self) -> None:
        import warnings

        self._level = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: Any) -> None:
        self._warnings.__exit__(*exc)
        optuna.logging.set_verbosity(self._level)
