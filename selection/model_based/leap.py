"""LeAP: learnable adaptive permutation feature selection (docs/methods.md §1.2).

During training, every field at the seam (each sparse feature's pooled embedding, each dense
column) is mixed with a batch-shuffled replica of itself through one learned gate per field::

    h̃_f[b] = s_f · h_f[b] + (1 − s_f) · h_f[π_f(b)],     s_f = σ(θ_f / τ)

and the loss is ``L_task + λ Σ_f c_f · s_f``. A gate that the task cannot defend against the
penalty falls towards 0: the field can be replaced by a sample from its own marginal, which is
permutation importance learned jointly for all fields in one training run (§7.1). Because the
replica has the input's own scale, the downstream weights cannot inflate to undo a small gate
(the mask–gate compensation of a multiplicative mask).

    report = LeAP().rank(recipe)          # one fit with the LeAPSeam installed
    report.top_k(10)
    report.extras["gate_trajectory"]      # gates every ``record_every`` training steps

Public names: :class:`LeAPSeam` (the seam transform), :class:`LeAP` (the importance method),
:class:`LeAPRegularizer` and :class:`LeAPEvalGate` (typed options).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, unique
from typing import Any, ClassVar

import torch
from torch import nn

from recsys.data.schema import Schema
from recsys.models.seam import SeamTransform, step_on
from recsys.train.recipe import FitResult, Recipe
from selection.base import (
    ImportanceMethod,
    feature_widths,
    screen_leakage,
    screen_memorisable,
    trained_schema,
    training_relevance,
    with_memorisable_demoted,
)
from selection.model_based.leap_fusion import LeAPFusion, borda_fusion, fuse, product_fusion, sum_fusion
from selection.model_based.seam_selector import trained_seam
from selection.report import ImportanceReport

__all__ = [
    "LeAP", "LeAPEvalGate", "LeAPFusion", "LeAPGateData", "LeAPRegularizer", "LeAPSeam", "borda_fusion", "fuse", "leap_gates",
    "product_fusion", "sum_fusion",
]


@unique
class LeAPRegularizer(str, Enum):
    """How LeAP removes the width and sparsity bias of the gate gradients (§1.2, "Objective")."""

    GRADIENT_NORMALIZATION = "gradient_normalization"  # task grad of s_f / (d_f^α · max(ρ̂_f, ε)); uniform λ
    PENALTY_SCALING = "penalty_scaling"  # c_f = EMA |∂L_task/∂s_f| (stop-gradient); λ is scale-free


@unique
class LeAPGateData(str, Enum):
    """Which rows the gates learn from."""

    TRAIN = "train"  # the gates are trained with the model, on its training batches
    VALIDATION = "validation"  # [INF] first-order bi-level: the gates step on validation batches only


@unique
class LeAPEvalGate(str, Enum):
    """What the seam does outside training."""

    IDENTITY = "identity"  # s = 1: every field passes unchanged (the model as deployed before removal)
    HARD = "hard"  # fields with s_f < threshold are replaced by their running training mean


class LeAPSeam(SeamTransform):
    """Mixes every seam field with a batch-shuffled replica through a learned per-field gate.

    Training mode, batch of B rows, F fields (sparse features then dense columns):

    1. draw an independent row permutation π_f of ``0..B-1`` for every field;
    2. ``s = σ(θ / τ)``, one scalar per field, broadcast over the field's D_f columns;
    3. ``h̃_f = s_f · h_f + (1 − s_f) · h_f[π_f]``.

    Evaluation mode is the identity (``s = 1``) by default: the trained network sees clean
    inputs, so validation/test AUC measure the backbone, and the exported model is the plain
    model. ``eval_gate="hard"`` instead replaces every field whose gate ended below
    ``threshold`` by its running training mean (a constant, so serving stays deterministic):
    a preview of the model with those fields removed, without retraining. Both eval paths are
    TorchScript-scriptable; the training path is ``@torch.jit.unused``.

    Penalty ``λ Σ_f c_f s_f`` (:meth:`regularization`, added to the loss by the training
    module), with the gate gradient's two biases (the sum over ``d_f`` columns makes it grow
    with width; only the fraction ``ρ_f`` of rows whose value differs from its partner's
    contributes, ~2·p_f for a field at its default in most rows) removed by one of:

    * ``gradient_normalization`` (b, the default): the *task* gradient of ``s_f`` is divided by
      ``d_f^α · max(ρ̂_f, ε)`` (``ρ̂_f`` = share of batch rows that differ from their partner,
      measured in the batch, so no default value is needed), ``c_f = 1``. Under Adam, which
      normalises each parameter's update by its own gradient scale, rescaling the whole
      gradient of one gate would change nothing; what counts is the ratio of the two terms:
      the gate rises while ``−E[g_task,f] > λ · d_f^α · ρ_f``, i.e. each field faces a *fixed*
      threshold on its expected task derivative, scaled by its width and activation rate
      (a rare field is judged per active row). λ is in units of the derivative of the mean
      BCE with respect to a gate.
    * ``penalty_scaling`` (a): ``c_f = EMA(|∂L_task/∂s_f|)`` (stop-gradient, refreshed every
      step, bias-corrected like Adam's moments). Under Adam the sign of the update is decided
      by ``|E g_task|`` against ``λ · E|g_task|``: λ ∈ (0, 1) is a scale-free threshold on the
      *consistency* of the task gradient (signal over signal-plus-noise), independent of width
      and sparsity by construction. Its blind spot is that consistency is not relevance: a
      wide id field that memorises noise ids on the training set (from the second epoch on)
      yields a small but consistent gradient and keeps its gate, whatever λ.

    The task-only gradient of ``s`` is read with a tensor hook on the ``s`` used in the
    forward; the penalty is computed from a separately evaluated ``σ(θ/τ)`` so its gradient
    reaches θ without passing the hook.

    Why (b) and λ = 1e-3 are the defaults. Measured on the 40-field selection benchmark
    (``selection_benchmark_config(60_000)`` with ``embedding_dim="by_cardinality"``: widths
    4/8/16 for sparse fields, 1 for dense; ``promo_flag``/``promo_flag_2`` at their default in
    99% of rows; 10 signal fields, 2 redundant copies, 28 noise), 4 epochs, batch 512, Adam
    lr 1e-3 (embeddings: fused Adagrad 0.05), gate lr 0.05, s₀ = 0.9, seed 0; DCNv2 with 2
    cross layers and a [128, 64] deep net, DLRM/DeepFM at their defaults. P@10 = share of the signal fields among the
    10 highest gates (signal and noise fields only); AUC = probability that a signal gate
    beats a noise gate; "noise kept" = noise gates ≥ 0.5:

    ========  ===============  ======  =====  ==========  =========  ===========  ==========
    backbone  variant          λ       P@10   gate AUC    min sig.   max noise    noise kept
    ========  ===============  ======  =====  ==========  =========  ===========  ==========
    DCNv2     (b) grad. norm.  3e-4    0.8    0.961       0.968      0.992        3
    DCNv2     (b) grad. norm.  1e-3    1.0    1.000       0.928      0.011        0
    DCNv2     (b), 8 epochs    1e-3    1.0    1.000       0.968      0.003        0
    DCNv2     (b), α = 1       1e-3    0.9    0.975       0.008      0.010        0
    DCNv2     (b) grad. norm.  3e-3    1.0    1.000       0.008      0.008        0
    DCNv2     (b) grad. norm.  1e-2    0.7    0.761       0.006      0.007        0
    DCNv2     (a) pen. scal.   0.3     0.7    0.900       0.902      0.996        14
    DCNv2     (a) pen. scal.   0.6     0.7    0.893       0.825      0.978        7
    DCNv2     (a) pen. scal.   0.9     0.7    0.893       0.588      0.902        4
    DLRM      (b) grad. norm.  1e-3    0.9    0.968       0.010      0.030        0
    DLRM      (a) pen. scal.   0.6     0.7    0.900       0.757      0.984        7
    DeepFM    (b) grad. norm.  1e-3    0.7    0.907       0.893      0.990        11
    DeepFM    (b) grad. norm.  3e-3    0.9    0.993       0.861      0.883        2
    DeepFM    (a) pen. scal.   0.6     0.5    0.711       0.796      0.985        21
    ========  ===============  ======  =====  ==========  =========  ===========  ==========

    Under (a) the three user-like ``noise_id*`` fields (10k values, width 16) keep gates of
    0.88–0.99 at every λ, and raising λ to remove more noise pulls the signal gates down first
    (the rare flags fall to 0.59 at λ = 0.9). Under (b) the width factor raises the bar for
    exactly those fields; at λ = 1e-3 every noise gate of DCNv2 ends below 0.011 and every
    signal gate above 0.92, both rare flags at ≥ 0.99 and the 1-D dense fields at ≥ 0.95
    (nothing over-sparsified for being narrow), and the gates are polarised after 4 epochs
    (and stay so over 8: signal ≥ 0.968, noise ≤ 0.003). Larger λ (or α = 1) first drops
    ``user_id`` (width 16, ~5 training rows per id), the field with the least learnable
    signal per dimension. DeepFM needs a larger λ (its first-order terms memorise ids): at
    1e-3 it keeps 11 noise gates, at 3e-3 two. The window of good λ for (b) is about
    1e-3–3e-3; tune it per backbone so that the planted noise gates end near 0 on a
    synthetic run.

    Why the gates start at s ≈ 0.98 (``init_logit=4``), not 0.9 (the table above used 2.2).
    A field whose signal lies in an interaction the backbone has not learned yet (Frappe's
    ``user``: useful only together with ``item``) gets little task gradient early on, so a
    gate that starts half-noised closes before the interaction is learned. Measured with the
    selection benchmark's Frappe recipe (DCNv2, 4 epochs, batch 2048): at s₀ ≈ 0.9 ``user``
    ends at 0.08 (rank 8 of 10); at s₀ ≈ 0.98 at 0.89 (rank 2, after ``item``), with the
    context fields still polarised to 0.04–0.27. On Criteo head-10k the AUKC of the LeAP
    ranking went from 0.7234 to 0.7266 (the all-fields model: 0.734), on the 40-field synthetic
    layout the precision@10 stayed at 0.9.

    Args:
        penalty: λ, the one important knob.
        regularizer: ``gradient_normalization`` (b) or ``penalty_scaling`` (a).
        learning_rate: learning rate of the gate logits (the training module gives the seam
            its own optimizer group, without weight decay).
        init_logit: θ at the start; the default 4.0 gives s ≈ 0.98 (almost all signal passing).
        temperature: τ.
        alpha: width exponent α of the normalisation (b), 0.5 or 1.
        ema: decay of the |task gradient| average (a).
        epsilon: floor ε of ``ρ̂_f`` (b).
        eval_gate: ``identity`` or ``hard`` (see above).
        threshold: gate value under which a field counts as removed (hard eval gate).
        record_every: record the gates every this many training steps (the trajectory).
        gate_data: ``train`` (the gates are ordinary parameters of the fit) or ``validation``:
            [INF] the gates leave the model's optimizer and take an Adam step (``learning_rate``)
            on the task loss of one validation batch plus the penalty every ``controller_every``
            training steps, the embedding lookups of that batch without gradients (as AutoField's
            controller, methods.md §7.2). The backbone still trains on mixed training rows, so a
            field whose training signal is memorised (an id seen a few times) earns no gate: its
            mixing does not hurt the validation loss.
        controller_every: training steps between two validation gate steps (``validation`` only).

    Example::

        model = DCNv2(schema, seam=LeAPSeam(penalty=1e-3))
        model.seam.gates()                # F gates, sparse features then dense columns
        model.seam.trajectory()           # {"steps": [...], "gates": {feature: [...]}}
    """

    #: training-only state TorchScript never sees (the base class annotates ``controller_every``)
    __jit_ignored_attributes__ = ["controller_every", "controller_steps", "gate_data", "on_validation",
                                  "_gate_optimizer", "_controller_pass"]

    def __init__(
        self,
        penalty: float = 0.001,
        regularizer: LeAPRegularizer | str = LeAPRegularizer.GRADIENT_NORMALIZATION,
        learning_rate: float = 0.05,
        init_logit: float = 4.0,
        temperature: float = 1.0,
        alpha: float = 0.5,
        ema: float = 0.9,
        epsilon: float = 0.01,
        eval_gate: LeAPEvalGate | str = LeAPEvalGate.IDENTITY,
        threshold: float = 0.5,
        record_every: int = 20,
        gate_data: LeAPGateData | str = LeAPGateData.TRAIN,
        controller_every: int = 1,
    ) -> None:
        super().__init__()
        if penalty < 0:
            raise ValueError(f"LeAPSeam.penalty must be >= 0, got {penalty}")
        if temperature <= 0:
            raise ValueError(f"LeAPSeam.temperature must be > 0, got {temperature}")
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"LeAPSeam.ema must be in [0, 1), got {ema}")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"LeAPSeam.threshold must be in (0, 1), got {threshold}")
        if record_every < 1:
            raise ValueError(f"LeAPSeam.record_every must be >= 1, got {record_every}")
        if controller_every < 1:
            raise ValueError(f"LeAPSeam.controller_every must be >= 1, got {controller_every}")
        self.penalty = float(penalty)
        self.regularizer_kind = LeAPRegularizer(regularizer).value
        self.normalize_gradient = LeAPRegularizer(regularizer) is LeAPRegularizer.GRADIENT_NORMALIZATION
        self.learning_rate = float(learning_rate)
        self.init_logit = float(init_logit)
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.ema = float(ema)
        self.epsilon = float(epsilon)
        self.eval_gate_kind = LeAPEvalGate(eval_gate).value
        self.hard_eval = LeAPEvalGate(eval_gate) is LeAPEvalGate.HARD
        self.threshold = float(threshold)
        self.record_every = int(record_every)
        self.gate_data = LeAPGateData(gate_data).value
        self.on_validation = LeAPGateData(gate_data) is LeAPGateData.VALIDATION
        #: read by the training module: 0 = no controller (the gates train with the model)
        self.controller_every = int(controller_every) if self.on_validation else 0
        self._gate_optimizer: torch.optim.Optimizer | None = None
        self._controller_pass = False
        self.controller_steps = 0
        # filled by bind(); the eval path (TorchScript) reads sparse_names, offsets, num_sparse
        # and num_dense. Empty lists are built as `list[str]()`: TorchScript warns about an
        # annotated empty container in __init__ and infers the type of the bound value instead
        self.sparse_names = list[str]()
        self.dense_names = list[str]()
        self.field_names = list[str]()
        self.offsets = [0]  # column offsets of the fields in the concatenated seam
        self.num_sparse = 0
        self.num_dense = 0
        self.logits = nn.Parameter(torch.zeros(0))
        # buffers (bind() registers them with their sizes; declared here for type checkers)
        self.widths: torch.Tensor
        self.column_fields: torch.Tensor
        self.grad_ema: torch.Tensor
        self.grad_steps: torch.Tensor
        self.running_mean: torch.Tensor
        self.mean_steps: torch.Tensor
        self.last_logits: torch.Tensor
        self.last_task_grad: torch.Tensor
        self.last_rho: torch.Tensor
        self.register_buffer("running_mean", torch.zeros(0))
        self._train_steps = 0
        self._history_steps = list[int]()  # training steps at which the gates were recorded
        self._history_gates = list[list[float]]()  # the gates (F floats) at those steps

    # -- setup -------------------------------------------------------------------------------
    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str],
             dense_dims: list[int] | None = None) -> None:
        self.sparse_names = list(sparse_names)
        self.dense_names = list(dense_names)
        self.field_names = self.sparse_names + self.dense_names
        self.num_sparse = len(self.sparse_names)
        self.num_dense = len(self.dense_names)
        widths = [int(d) for d in sparse_dims] + ([1] * len(self.dense_names) if dense_dims is None else
                                                   [int(d) for d in dense_dims])
        offsets = [0]
        for w in widths:
            offsets.append(offsets[-1] + w)
        self.offsets = offsets
        n = len(self.field_names)
        self.logits = nn.Parameter(torch.full((n,), self.init_logit))
        self.register_buffer("widths", torch.tensor(widths, dtype=torch.float32))
        # the field of each seam column, C (the mixing step gathers per column)
        column_fields = torch.repeat_interleave(torch.arange(n), torch.tensor(widths, dtype=torch.long))
        self.register_buffer("column_fields", column_fields, persistent=False)
        # (a): EMA of |dL_task/ds| and its step count (for the bias correction)
        self.register_buffer("grad_ema", torch.zeros(n))
        self.register_buffer("grad_steps", torch.zeros((), dtype=torch.long))
        # hard eval gate: running mean of every seam column over training batches
        self.register_buffer("running_mean", torch.zeros(offsets[-1]))
        self.register_buffer("mean_steps", torch.zeros((), dtype=torch.long))
        # last training step (not in the state dict: loading the best checkpoint keeps them)
        self.register_buffer("last_logits", self.logits.detach().clone(), persistent=False)
        self.register_buffer("last_task_grad", torch.zeros(n), persistent=False)
        self.register_buffer("last_rho", torch.ones(n), persistent=False)
        self._train_steps = 0
        self._history_steps = []
        self._history_gates = []
        self._gate_optimizer = None
        self.controller_steps = 0

    # -- gates -------------------------------------------------------------------------------
    def gates(self) -> torch.Tensor:
        """s = σ(θ/τ), F (sparse features in seam order, then dense columns)."""
        return torch.sigmoid(self.logits / self.temperature)

    @torch.jit.unused
    def gate_dict(self, final: bool = True) -> dict[str, float]:
        """Feature -> gate. ``final=True`` reads the gates after the last training step (the
        parameters may since have been reloaded from an earlier, best-validation checkpoint);
        ``final=False`` reads the current parameters."""
        logits = self.last_logits if final and self._train_steps > 0 else self.logits.detach()
        s = torch.sigmoid(logits / self.temperature).cpu().tolist()
        return dict(zip(self.field_names, (float(v) for v in s), strict=True))

    @torch.jit.unused
    def coefficients(self) -> dict[str, float]:
        """Feature -> the current penalty coefficient c_f (1 under gradient normalisation)."""
        return dict(zip(self.field_names, self._coefficients().cpu().tolist(), strict=True))

    @torch.jit.unused
    def trajectory(self) -> dict[str, Any]:
        """Recorded gates: ``{"steps": [k, ...], "gates": {feature: [s at step k, ...]}}``;
        the last training step is always included."""
        steps, rows = list(self._history_steps), [list(r) for r in self._history_gates]
        if self._train_steps > 0 and (not steps or steps[-1] != self._train_steps):
            steps.append(self._train_steps)
            rows.append(torch.sigmoid(self.last_logits / self.temperature).cpu().tolist())
        return {"steps": steps, "gates": {name: [r[i] for r in rows] for i, name in enumerate(self.field_names)}}

    # -- forward -------------------------------------------------------------------------------
    def forward(
        self, sparse: dict[str, torch.Tensor], dense: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if not torch.jit.is_scripting():
            if self.training:
                return self._train_forward(sparse, dense)
        if self.hard_eval:
            return self._hard_gate(sparse, dense)
        return sparse, dense

    def _hard_gate(
        self, sparse: dict[str, torch.Tensor], dense: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Fields with s_f < threshold -> their running training mean; the rest unchanged."""
        keep = torch.sigmoid(self.logits / self.temperature) >= self.threshold
        out: dict[str, torch.Tensor] = {}
        for i, name in enumerate(self.sparse_names):
            h = sparse[name]
            mean = self.running_mean[self.offsets[i] : self.offsets[i + 1]].to(h.dtype)
            out[name] = torch.where(keep[i], h, mean.unsqueeze(0))  # no host sync on the gate
        if self.num_dense > 0:
            start = self.offsets[self.num_sparse]
            mean_dense = self.running_mean[start:].to(dense.dtype)
            keep_columns = keep.index_select(0, self.column_fields[start:])  # a vector's D columns share its gate
            dense = torch.where(keep_columns.unsqueeze(0), dense, mean_dense.unsqueeze(0))
        return out, dense

    @torch.jit.unused
    def draw_permutations(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """F x B independent row permutations (one per field) from the global torch RNG."""
        return torch.argsort(torch.rand(len(self.field_names), batch_size, device=device), dim=1)

    @torch.jit.unused
    def mix(
        self, sparse: dict[str, torch.Tensor], dense: torch.Tensor, gates: torch.Tensor, permutations: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """The mixing step with given gates and permutations.

        Args:
            sparse: feature -> B x D_f.
            dense: B x D_dense.
            gates: F (sparse then dense).
            permutations: F x B row indices.

        Returns:
            (mixed sparse dict, mixed dense B x D_dense, ρ̂ F: share of rows whose value differs
            from its partner's).
        """
        x = self.columns(sparse, dense)
        index = permutations.index_select(0, self.column_fields)  # C x B: each column's field permutation
        replica = torch.gather(x, 0, index.t())
        g = gates.index_select(0, self.column_fields)
        mixed = g * x + (1.0 - g) * replica
        with torch.no_grad():  # rows whose field differs from its partner in any column
            differs = x.new_zeros(x.size(0), len(self.field_names))
            differs.index_add_(1, self.column_fields, (x != replica).to(x))
            rho = (differs > 0).float().mean(dim=0)
        split = self.offsets[self.num_sparse]
        widths = [b - a for a, b in zip(self.offsets, self.offsets[1 : self.num_sparse + 1])]
        parts = torch.split(mixed[:, :split], widths, dim=1)
        out = {name: p.to(sparse[name].dtype) for name, p in zip(self.sparse_names, parts)}
        return out, mixed[:, split:].to(dense.dtype), rho

    @torch.jit.unused
    def columns(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        """The seam as one B x C matrix: the sparse fields' columns in seam order, then dense."""
        return torch.cat([sparse[n] for n in self.sparse_names] + ([dense] if self.num_dense else []), dim=1)

    @torch.jit.unused
    def _train_forward(
        self, sparse: dict[str, torch.Tensor], dense: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if not self.field_names:
            raise RuntimeError("LeAPSeam is not bound to a model: install it with model.set_seam(seam)")
        batch = dense.size(0)
        perms = self.draw_permutations(batch, self.logits.device)
        s = self.gates()
        out, dense_out, rho = self.mix(sparse, dense, s, perms)
        self.last_rho.copy_(rho)
        if s.requires_grad:  # a hook registered before backward sees only dL_task/ds (see regularization)
            s.register_hook(self._task_gradient_hook(rho))
        if self._controller_pass:  # a validation batch of the gate step: no training statistics
            return out, dense_out
        with torch.no_grad():
            self._update_running_mean(sparse, dense)
            self.last_logits.copy_(self.logits.detach())
            self._train_steps += 1
            if self._train_steps % self.record_every == 0:
                self._history_steps.append(self._train_steps)
                self._history_gates.append(torch.sigmoid(self.logits / self.temperature).cpu().tolist())
        return out, dense_out

    @torch.jit.unused
    def normalization(self, rho: torch.Tensor) -> torch.Tensor:
        """(b)'s divisor per field: ``d_f^α · max(ρ̂_f, ε)``, F."""
        return self.widths.pow(self.alpha) * rho.clamp(min=self.epsilon)

    @torch.jit.unused
    def _task_gradient_hook(self, rho: torch.Tensor) -> Any:
        divisor = self.normalization(rho) if self.normalize_gradient else None

        def hook(grad: torch.Tensor) -> torch.Tensor | None:
            g = grad.detach()
            self.last_task_grad.copy_(g)
            self.grad_ema.mul_(self.ema).add_(g.abs(), alpha=1.0 - self.ema)
            self.grad_steps.add_(1)
            if divisor is not None:
                return grad / divisor.to(grad)
            return None

        return hook

    @torch.jit.unused
    def _update_running_mean(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> None:
        batch_mean = self.columns(sparse, dense).detach().float().mean(dim=0)
        # the first batch sets the mean, later ones move it by 1% (tensor ops: no host sync)
        weight = torch.where(self.mean_steps == 0, 1.0, 0.01).to(batch_mean)
        self.running_mean.lerp_(batch_mean, weight)
        self.mean_steps.add_(1)

    # -- penalty -------------------------------------------------------------------------------
    @torch.jit.unused
    def _coefficients(self) -> torch.Tensor:
        if self.normalize_gradient:
            return torch.ones_like(self.grad_ema)
        # bias-corrected EMA (0 before the first gradient); tensor ops, no host sync
        correction = 1.0 - torch.pow(torch.full_like(self.grad_ema, self.ema), self.grad_steps.to(self.grad_ema))
        return torch.where(self.grad_steps > 0, self.grad_ema / correction.clamp(min=1e-12), 0.0)

    @torch.jit.unused
    def regularization(self) -> torch.Tensor:
        """``λ Σ_f c_f σ(θ_f/τ)`` from a freshly evaluated σ (the forward's hook never sees it);
        0 when the gates learn on validation batches (:meth:`controller_step` adds it there)."""
        if self.on_validation:
            return self.logits.sum() * 0.0
        return self._penalty()

    @torch.jit.unused
    def _penalty(self) -> torch.Tensor:
        if not self.field_names or self.penalty == 0.0:
            return self.logits.sum() * 0.0
        return self.penalty * (self._coefficients().detach() * self.gates()).sum()

    # -- validation gates (gate_data="validation") ------------------------------------------------
    @torch.jit.unused
    def controller_parameters(self) -> list[nn.Parameter]:
        return [self.logits] if self.on_validation else []

    @torch.jit.unused
    def controller_step(self, loss: Callable[[], torch.Tensor]) -> None:
        """One Adam step of the gates on ``loss()`` (a validation batch, mixed by this seam in
        training mode) plus the penalty; the hook of the forward normalises the task part as on
        training batches."""
        if not self.on_validation:
            return
        if self._gate_optimizer is None:
            self._gate_optimizer = torch.optim.Adam([self.logits], lr=self.learning_rate)
        self._controller_pass = True
        try:
            objective = loss() + self._penalty()
        finally:
            self._controller_pass = False
        step_on(self._gate_optimizer, [self.logits], objective)
        self.controller_steps += 1


def leap_gates(model: nn.Module) -> dict[str, float]:
    """Feature -> final gate of a model trained with a :class:`LeAPSeam` at its seam."""
    seam = getattr(model, "seam", None)
    if not isinstance(seam, LeAPSeam):
        raise TypeError(f"the model's seam is {type(seam).__name__}, not LeAPSeam")
    return seam.gate_dict(final=True)


@dataclass
class LeAP(ImportanceMethod):
    """LeAP feature importance: one training run with :class:`LeAPSeam`; importance = final gate.

    Cost is one fit (plus the recipe's test pass), against F × R evaluation passes *after* a
    fit for permutation importance. See :class:`LeAPSeam` for the mechanism and why the
    default regulariser is gradient normalisation.

    Args:
        penalty: λ.
        regularizer: ``gradient_normalization`` or ``penalty_scaling``.
        learning_rate: gate learning rate.
        init_logit: initial gate logit (4.0: s ≈ 0.98).
        temperature: τ.
        alpha: width exponent of the gradient normalisation.
        max_epochs: override the recipe's ``trainer.max_epochs`` (None: the recipe's).
        seed: ``seed_everything`` of the fit (the permutations come from the global RNG).
        threshold: gate value under which a field counts as removed
            (``dimensions_removed_at_threshold``).
        tracking: log the fit to MLflow.
        leakage_threshold: features of the training rows scoring at least this x a copy of the
            label (OutRank's check) are left out of the fit and listed as excluded; 0 turns the
            screen off.
        gate_data: ``train`` or ``validation`` (the gates step on validation batches; see
            :class:`LeAPSeam`).
        controller_every: training steps between two validation gate steps.
        fusion: how the final gates are combined with OutRank's relevance on the training rows
            (the leakage screen computes it anyway) and the held-out drops
            (:mod:`selection.model_based.leap_fusion`): ``auto`` (the default: ``relevance_heldout`` up to
            ``heldout_fields`` fields, ``sum`` beyond, so the ranking costs no pass per field at
            width), ``relevance_heldout`` (relevance + drop, each on [0, 1], the gates breaking
            ties; the highest validation AUKC of the fusions on Criteo, MovieLens and Frappe,
            issue 17 note), ``heldout`` (gate + relevance + drop), ``sum`` (gate + relevance),
            ``product``, ``borda``, ``drop`` or ``none`` (the gates alone).
        heldout_rows: [INF] rows of the validation split (a seeded uniform sample) on which the
            LeAP-trained model, its seam the identity, scores each field swapped for a shuffled
            replica (:func:`~selection.model_based.permutation.permutation_drops`, one repeat): one
            evaluation pass per field, no second fit. 0 turns it off (the fusions that read the
            drops then raise).
        heldout_fields: [INF] the held-out drops are measured for at most this many fields: the
            highest by the sum fusion (gate + relevance, what the run has before any drop); the
            others count as no drop, ranked by what they have. The ranking's cost beyond the fit
            is then at most this many evaluation passes at any F (one per field up to it: the
            same ranking as measuring them all). None: every field.
        copy_threshold: [INF] a feature that copies one ranked above it (each determines the
            other to this share of its own corrected score on a batch of training rows:
            :func:`~selection.model_free.outrank_scoring.redundant_features`, e.g. a relabelled id or a
            rescaled price) is ranked after every other feature, flagged ``copy`` (its source in
            ``extras["copies"]``): a top-k keeps one of the two. 0 turns it off.
        id_screen: rank ID-like features with no signal beyond chance on the training rows
            after all the others (:func:`~selection.base.screen_memorisable`).

    The report: score = final gate s_f (after the last training step) fused with relevance
    (:func:`fuse`; the gates and relevance in ``extras["gates"]``, ``extras["relevance"]``), width = seam width,
    ``cost_seconds`` = the fit's wall time, extras = ``gate_trajectory``,
    ``best_checkpoint_gates``, ``penalty_coefficients``, ``dimensions_removed_at_threshold``,
    ``fields_removed_at_threshold``, ``test_auc`` / ``best_val_auc`` of the LeAP model
    (evaluated with the identity eval gate), ``regularizer``, ``run_id``, ``run_dir`` (the
    fit's folder, with its checkpoints), ``fit_seconds``.
    """

    name: ClassVar[str] = "leap"
    penalty: float = 0.001
    regularizer: LeAPRegularizer = LeAPRegularizer.GRADIENT_NORMALIZATION
    learning_rate: float = 0.05
    init_logit: float = 4.0
    temperature: float = 1.0
    alpha: float = 0.5
    max_epochs: int | None = None
    seed: int = 0
    threshold: float = 0.5
    tracking: bool = True
    leakage_threshold: float = 0.9
    gate_data: LeAPGateData = LeAPGateData.TRAIN
    controller_every: int = 1
    fusion: LeAPFusion = LeAPFusion.AUTO
    heldout_rows: int = 500_000
    heldout_fields: int | None = 64
    copy_threshold: float = 0.9
    id_screen: bool = True

    def __post_init__(self) -> None:
        self.regularizer = LeAPRegularizer(self.regularizer)
        self.gate_data = LeAPGateData(self.gate_data)
        self.fusion = LeAPFusion(self.fusion)
        if self.fusion.reads_heldout and self.heldout_rows <= 0:
            raise ValueError(f"fusion {self.fusion.value!r} reads the held-out drops: heldout_rows must be > 0")

    def seam_spec(self) -> dict[str, Any]:
        """The ``model.seam`` spec this method trains with."""
        return {
            "class_path": f"{LeAPSeam.__module__}.{LeAPSeam.__name__}",
            "init_args": {
                "penalty": self.penalty,
                "regularizer": self.regularizer.value,
                "learning_rate": self.learning_rate,
                "init_logit": self.init_logit,
                "temperature": self.temperature,
                "alpha": self.alpha,
                "threshold": self.threshold,
                "gate_data": self.gate_data.value,
                "controller_every": self.controller_every,
            },
        }

    def resolved_fusion(self, fields: int) -> LeAPFusion:
        """The fusion a ranking of ``fields`` seam fields uses (``auto`` resolved)."""
        if self.fusion is not LeAPFusion.AUTO:
            return self.fusion
        small = self.heldout_fields is None or fields <= self.heldout_fields
        return LeAPFusion.RELEVANCE_HELDOUT if small and self.heldout_rows > 0 else LeAPFusion.SUM

    def rank(self, recipe: Recipe, run_name: str = "leap", parent_run_id: str | None = None) -> ImportanceReport:
        start = time.perf_counter()
        fusion = self.resolved_fusion(len(recipe.schema.names))
        fused = fusion is not LeAPFusion.NONE
        if fusion.reads_heldout and not recipe.datamodule.has_split("val"):
            raise ValueError(f"fusion {fusion.value!r} reads drops on the validation split, and the "
                             "recipe's data has none (split.val = 0): give it one or pick fusion='sum'")
        relevance = training_relevance(recipe) if self.leakage_threshold > 0 or fused else None
        leaks = screen_leakage(recipe, self.leakage_threshold, relevance) if self.leakage_threshold > 0 else {}
        fit = recipe.fit(
            features=[n for n in recipe.schema.names if n not in leaks] if leaks else None,
            seam=self.seam_spec(),
            max_epochs=self.max_epochs,
            seed=self.seed,
            run_name=run_name,
            parent_run_id=parent_run_id,
            tracking=self.tracking,
        )
        seam = trained_seam(fit, LeAPSeam)
        schema = trained_schema(recipe)
        extras = {
            "test_auc": fit.metrics.get("test_auc"),
            "best_val_auc": fit.metrics.get("best_val_auc"),
            "run_id": fit.run_id,
            "run_dir": fit.root_dir,
            "fit_seconds": fit.seconds,
        }
        heldout = None
        gates = seam.gate_dict(final=True)
        # the drops: when the fusion reads them, or when they are cheap (every field within budget)
        if fused and self.heldout_rows > 0 and (
                fusion.reads_heldout or self.heldout_fields is None or len(gates) <= self.heldout_fields):
            candidates = None
            if self.heldout_fields is not None and len(gates) > self.heldout_fields:
                first = sum_fusion(gates, relevance.relevance if relevance is not None else {})
                candidates = sorted(gates, key=lambda f: -first[f])[: self.heldout_fields]
            heldout = self.heldout_drops(fit, candidates)
            extras["heldout_fields"] = len(gates) if candidates is None else len(candidates)
        extras["fusion"] = fusion.value
        report = self.report(
            seam, schema, cost_seconds=time.perf_counter() - start, dataset=recipe.dataset_name, extras=extras,
            relevance=relevance.relevance if fused and relevance is not None else None, heldout=heldout, fusion=fusion,
        )
        report.excluded.update({f: f"{reason} (trained without it)" for f, reason in leaks.items()})
        if self.copy_threshold > 0:
            from selection.model_free.outrank_scoring import redundant_features

            report = report.demoted(redundant_features(recipe.raw_split("train"), report.ranking, self.copy_threshold))
        if self.id_screen:
            report = screen_memorisable(recipe, report)
        report.cost_seconds = time.perf_counter() - start
        return report

    def heldout_drops(self, fit: FitResult, features: list[str] | None = None) -> dict[str, float] | None:
        """Feature -> validation AUC drop of ``fit``'s model with the field swapped for a shuffled
        replica (``heldout_rows`` sampled rows; None without a validation split), for
        ``features`` (default every seam field)."""
        from selection.model_based.permutation import permutation_drops

        if not fit.datamodule.has_split("val"):
            return None
        data = fit.datamodule.sample_rows("val", self.heldout_rows, seed=self.seed)
        _, drops = permutation_drops(fit.task.model, data, repeats=1, seed=self.seed, features=features, group_size=1)
        return {f: float(d[0]) for f, d in drops.items()}

    def refuse(self, report: ImportanceReport, fusion: LeAPFusion | str, copies: bool = True) -> ImportanceReport:
        """``report`` (this method's, with ``extras["gates"]`` and ``extras["relevance"]``)
        ranked under another ``fusion``, without a second fit: same cost, same extras; the
        copies ``report`` demoted are demoted again unless ``copies`` is False, and so are its
        ID-like features (``extras["memorisable"]``)."""
        fusion = LeAPFusion(fusion)
        gates, relevance, heldout = (report.extras.get(k) for k in ("gates", "relevance", "heldout"))
        if gates is None or relevance is None:
            raise ValueError("refuse needs a LeAP report with its gates and relevance (LeAP(fusion != 'none').rank)")
        widths = {f.feature: f.width for f in report.features}
        kinds = {f.feature: f.kind for f in report.features}
        flags = {f.feature: tuple(x for x in f.flags if x not in ("copy", "id_like")) for f in report.features if f.flags}
        memorisable = dict(report.extras.get("memorisable") or {})
        pairs = dict(report.extras.get("copies") or {})
        out = ImportanceReport.from_scores(
            self.name, fuse(gates, relevance, fusion, heldout), widths=widths, kinds=kinds, flags=flags,
            config=self.describe() | {"fusion": fusion.value, "copy_threshold": self.copy_threshold if copies else 0.0},
            cost_seconds=report.cost_seconds, dataset=report.dataset, excluded=dict(report.excluded),
            extras={k: v for k, v in report.extras.items() if k not in ("copies", "memorisable", "unscreened_ranking")},
        )
        if copies and pairs:
            out = self._copies_demoted(out, pairs)
        return with_memorisable_demoted(out, memorisable)

    @staticmethod
    def _copies_demoted(out: ImportanceReport, pairs: dict[str, str]) -> ImportanceReport:
        """``out`` with the lower member (in ``out``'s order) of every copied pair demoted."""
        rank = {n: i for i, n in enumerate(out.ranking)}
        lower = {}  # of each copied pair, the one this ranking puts lower goes after the rest
        for f, source in pairs.items():
            if f in rank and source in rank:
                lo, hi = (f, source) if rank[f] > rank[source] else (source, f)
                lower[lo] = hi
        return out.demoted(lower)

    def report(
        self,
        seam: LeAPSeam,
        schema: Schema,
        cost_seconds: float = 0.0,
        dataset: str = "",
        extras: dict[str, Any] | None = None,
        relevance: dict[str, float] | None = None,
        heldout: dict[str, float] | None = None,
        fusion: LeAPFusion | None = None,
    ) -> ImportanceReport:
        """The report of a trained :class:`LeAPSeam` (features of ``schema`` not at the seam are
        listed as excluded); with ``relevance`` (feature -> OutRank relevance) and ``heldout``
        (feature -> held-out AUC drop), ranked by ``fuse(gates, relevance, fusion, heldout)``
        (``fusion``: default this method's)."""
        gates = seam.gate_dict(final=True)
        widths = feature_widths(schema)
        removed = [f for f, s in gates.items() if s < self.threshold]
        flags = {f: ("removed_at_threshold",) for f in removed}
        excluded = {f: "not at the LeAP seam" for f in schema.names if f not in gates}
        out = {
            "gate_trajectory": seam.trajectory(),
            "best_checkpoint_gates": seam.gate_dict(final=False),
            "penalty_coefficients": seam.coefficients(),
            "dimensions_removed_at_threshold": int(sum(widths.get(f, 1) for f in removed)),
            "dimensions_total": int(sum(widths.get(f, 1) for f in gates)),
            "fields_removed_at_threshold": removed,
            "threshold": self.threshold,
            "regularizer": self.regularizer.value,
            **(extras or {}),
        }
        if relevance is not None:
            out.update(gates=gates, relevance={f: float(relevance.get(f, 0.0)) for f in gates})
        if heldout is not None:
            out["heldout"] = {f: float(heldout.get(f, 0.0)) for f in gates}
        return ImportanceReport.from_scores(
            self.name,
            fuse(gates, relevance, fusion or self.fusion, heldout) if relevance is not None else gates,
            widths={f: widths.get(f, 1) for f in gates},
            kinds={f.name: f.kind.value for f in schema.features},
            flags=flags,
            config=self.describe(),
            cost_seconds=cost_seconds,
            dataset=dataset,
            excluded=excluded,
            extras=out,
        )
