"""Permutation feature importance at the seam (Breiman 2001; docs/methods.md §7.1).

``PI_f = AUC(D) − (1/R) Σ_r AUC(D with field f permuted over the rows)``, on a held-out split
of a trained model. Every seam field counts: each sparse feature's pooled embedding and each
dense column.

Where the shuffle happens: a row's pooled embedding depends only on that row's ids, so
permuting the pooled embeddings of feature f across rows gives exactly the model input of the
data with column f permuted. The sparse arch therefore runs *once* over the split (the
embedding lookups are the expensive part), and each (field, repeat) pass runs only the seam
and the interaction on the cached tensors. The permutation is drawn over the whole split
(dataset-level), not per batch, so a field is compared with its marginal over the split.

    report = PermutationImportance(repeats=5).rank(recipe)       # trains once, scores on val
    report = PermutationImportance().rank_model(model, data, schema)  # an already trained model
    drop, std, base = permutation_importance(model, data)        # the raw numbers

On a streaming data module (``data.streaming``/``data.shards``) the scored rows are a seeded
uniform sample of at most ``max_rows`` rows of the split (default :data:`STREAM_MAX_ROWS`),
read shard by shard (:func:`recsys.data.streaming.split_view.sample_rows`), and the permutation is
drawn over that sample. Why a sample and not per-shard permutations: the cached seam of the
scored rows must be held for the R x F permuted passes anyway (N x seam width floats), and a
field permuted within each shard only would be compared with its marginal in that shard, not
the split's (shards of a time split differ); a uniform sample keeps the dataset-level
definition, and its AUC standard error at 500k rows is far below the drops that rank fields.
With ``max_rows`` at least the split's rows the sample is the whole split, in order, and the
scores equal the in-memory ones.

AUC is the plain rank-sum (Mann–Whitney) AUC with ties averaged, computed in float64 on the
whole split (:func:`recsys.metrics.binary_auc`, re-exported here), so it equals
``sklearn.metrics.roc_auc_score``.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import numpy as np
import torch

from recsys.data.batching import make_batch
from recsys.data.encoders import EncodedData
from recsys.data.schema import Schema
from recsys.data.streaming.split_view import SplitView, sample_rows
from recsys.metrics import binary_auc
from recsys.models.base import RankingModel
from recsys.models.seam import SeamTransform
from recsys.train.recipe import Recipe
from selection.base import (
    ImportanceMethod,
    WidthRefusal,
    feature_widths,
    screen_leakage,
    screen_memorisable,
    trained_schema,
)
from selection.report import ImportanceReport

__all__ = [
    "FieldShuffle",
    "STREAM_MAX_ROWS",
    "PermutationImportance",
    "ScoredSplit",
    "binary_auc",
    "field_permutation",
    "permutation_drops",
    "permutation_importance",
    "seam_fields",
]


class FieldShuffle(SeamTransform):
    """Permutes one field across the rows of the batch it sees: the evaluation-time seam
    transform of permutation importance.

    Args:
        field: a sparse feature (its pooled embedding is permuted) or a dense feature (its
            column of the dense tensor is permuted).
        permutation: the row order to apply (B, int64); when None, a fresh one is drawn per
            call from ``generator``.
        generator: torch generator for drawn permutations (default: the global RNG).

    Call: ``(sparse {name: B x D_f}, dense B x D_dense) -> same shapes``, with
    ``out[field][b] = in[field][permutation[b]]`` and everything else unchanged.

    Example::

        model.set_seam(FieldShuffle("user_id", torch.randperm(B)))
        shuffled_logits = model(dense, kjt)
    """

    def __init__(
        self, field: str, permutation: torch.Tensor | None = None, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.field = field
        self.permutation = permutation
        self.generator = generator
        self.dense_index: int | None = None
        self.dense_width = 1
        self.is_sparse: bool | None = None

    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str],
             dense_dims: list[int] | None = None) -> None:
        widths = [1] * len(dense_names) if dense_dims is None else [int(d) for d in dense_dims]
        if self.field in sparse_names:
            self.is_sparse, self.dense_index = True, None
        elif self.field in dense_names:
            j = list(dense_names).index(self.field)  # its first column; a vector takes dense_width of them
            self.is_sparse, self.dense_index, self.dense_width = False, sum(widths[:j]), widths[j]
        else:
            available = list(sparse_names) + list(dense_names)
            raise ValueError(f"FieldShuffle: {self.field!r} is not a seam field; available: {available}")

    def forward(
        self, sparse: dict[str, torch.Tensor], dense: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if self.is_sparse is None:  # not bound: resolve from the inputs
            self.is_sparse = self.field in sparse
            if not self.is_sparse:
                raise ValueError("FieldShuffle on a dense column must be bound first (model.set_seam)")
        batch = dense.size(0)
        perm = self.permutation
        if perm is None:
            perm = torch.randperm(batch, generator=self.generator).to(dense.device)
        elif perm.numel() != batch:
            raise ValueError(f"FieldShuffle: permutation has {perm.numel()} rows, the batch has {batch}")
        perm = perm.to(dense.device)
        if self.is_sparse:
            out = dict(sparse)
            out[self.field] = sparse[self.field][perm]
            return out, dense
        assert self.dense_index is not None
        cols = slice(self.dense_index, self.dense_index + self.dense_width)
        dense = dense.clone()
        dense[:, cols] = dense[perm, cols]
        return sparse, dense


def field_permutation(n: int, seed: int, feature: str, repeat: int) -> np.ndarray:
    """The dataset-level permutation of ``feature`` in repeat ``repeat``: a function of
    (seed, feature name, repeat) only, so adding or dropping other features or changing the
    evaluation order leaves it unchanged."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(feature.encode()), int(repeat)]).permutation(n)


def _dense_slices(model: RankingModel) -> dict[str, slice]:
    """Dense feature -> its columns of the model's dense tensor (a vector takes D)."""
    out, start = {}, 0
    for name, width in zip(model.schema.dense_names, model.schema.dense_widths, strict=True):
        out[name] = slice(start, start + width)
        start += width
    return out


def seam_fields(model: RankingModel) -> list[str]:
    """The model's seam fields: sparse features in seam order, then dense columns."""
    return list(model.sparse_names) + list(model.schema.dense_names)


@torch.no_grad()
def _sparse_arch_outputs(
    model: RankingModel, data: EncodedData, batch_size: int, device: torch.device
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Pooled embeddings N x D_f per feature, dense N x D_dense and labels N of the whole split."""
    names = list(model.sparse_names)
    offsets = {n: data.offsets(n) for n in data.sparse_names}
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    dense_parts, label_parts = [], []
    for start in range(0, len(data), batch_size):
        rows = np.arange(start, min(start + batch_size, len(data)))
        batch = make_batch(data, rows, offsets)
        pooled = model.sparse_arch(batch.sparse_features.to(device))
        for n in names:
            parts[n].append(pooled[n])
        dense_parts.append(batch.dense_features.to(device))
        label_parts.append(batch.labels)
    sparse = {n: torch.cat(parts[n]) for n in names}
    return sparse, torch.cat(dense_parts), torch.cat(label_parts)


@torch.no_grad()
def _scores(
    model: RankingModel, sparse: dict[str, torch.Tensor], dense: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """Logits N of the cached seam inputs: the model's own seam, then its interaction, in chunks."""
    out = []
    n = dense.size(0)
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        chunk = {k: v[start:stop] for k, v in sparse.items()}
        s, d = model.seam(chunk, dense[start:stop])
        out.append(model.interact(s, d).float().cpu())
    return torch.cat(out)


#: fields up to which permutation importance scores each field in its own pass by default
GROUP_FROM = 64


def permutation_drops(
    model: RankingModel,
    data: EncodedData,
    repeats: int = 5,
    seed: int = 0,
    batch_size: int = 8192,
    features: list[str] | None = None,
    group_size: int | None = None,
    tolerance: float = 1e-4,
    grouped: dict[str, int] | None = None,
    max_seconds: float | None = None,
) -> tuple[float, dict[str, list[float]]]:
    """Per-repeat AUC drops of every seam field: ``(base_auc, {field: [R drops]})``.

    See :func:`permutation_importance` for the arguments and the computation. With more than
    :data:`GROUP_FROM` fields (or ``group_size`` > 1) the fields are permuted in groups
    (:func:`_grouped_drops`): far fewer passes than fields where most fields carry nothing.
    ``grouped``, when given, receives each field whose drop is its group's share -> the group's size.
    ``max_seconds``: refuse (:class:`~selection.base.WidthRefusal`) right after the unpermuted
    pass when the passes it would take (at most ``repeats`` x (groups x (1 + 2 log2 size)) when
    grouped, ``repeats`` x F otherwise) at that pass's time exceed it.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    fields = seam_fields(model)
    features = fields if features is None else list(features)
    unknown = [f for f in features if f not in fields]
    if unknown:
        raise ValueError(f"features {unknown} are not seam fields of the model; available: {fields}")
    dense_index = _dense_slices(model)
    device = next(model.parameters()).device
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        sparse, dense, labels = _sparse_arch_outputs(model, data, batch_size, device)
        t0 = time.perf_counter()
        base = binary_auc(_scores(model, sparse, dense, batch_size), labels)
        pass_seconds = time.perf_counter() - t0
        n = dense.size(0)

        def group_drop(group: list[str], r: int) -> float:
            """AUC drop with every field of ``group`` permuted (each by its own permutation)."""
            moved, shuffled = dict(sparse), dense
            for f in group:
                perm = torch.from_numpy(field_permutation(n, seed, f, r)).to(device)
                if f in dense_index:
                    cols = dense_index[f]
                    shuffled = dense.clone() if shuffled is dense else shuffled
                    shuffled[:, cols] = dense[perm, cols]
                else:
                    moved[f] = sparse[f][perm]
            return base - binary_auc(_scores(model, moved, shuffled, batch_size), labels)

        size = group_size if group_size is not None else (1 if len(features) <= GROUP_FROM else _auto_group(len(features)))
        if max_seconds is not None:
            groups = math.ceil(len(features) / max(size, 1))
            passes = repeats * (len(features) if size <= 1 else groups * (1 + 2 * math.log2(size)))
            if passes * pass_seconds > max_seconds:
                raise WidthRefusal(
                    f"permutation: up to {passes:,.0f} evaluation passes of {pass_seconds:.2f} s each "
                    f"(~{passes * pass_seconds / 3600:.1f} h > max_seconds={max_seconds:g}) for {len(features):,} fields "
                    f"on {n:,} rows; LeAP ranks them in one training run, or lower repeats or max_rows, "
                    "or raise max_seconds")
        if size <= 1:
            drops = {f: [group_drop([f], r) for r in range(repeats)] for f in features}
        else:
            drops = _grouped_drops(features, size, repeats, tolerance, group_drop, seed, grouped)
    finally:
        for m, flag in flags:
            m.training = flag
    return base, drops


def _auto_group(fields: int) -> int:
    """Fields per group at the first level: about sqrt(F), a power of two (64 at F = 5,000)."""
    return int(2 ** round(math.log2(max(math.sqrt(fields), 2))))


def _drops_something(drops: list[float], tolerance: float) -> bool:
    """Whether a group's drops over the repeats say it matters: the mean is above ``tolerance``
    and, with two repeats or more, above two standard errors of the repeats (the permutation's
    own noise: a group of fields that carry nothing drops AUC by chance in single passes)."""
    mean = float(np.mean(drops))
    if len(drops) < 2:
        return mean > tolerance
    return mean > tolerance and mean > 2.0 * float(np.std(drops, ddof=1)) / math.sqrt(len(drops))


def _grouped_drops(
    features: list[str], size: int, repeats: int, tolerance: float, group_drop: Callable[[list[str], int], float],
    seed: int, grouped: dict[str, int] | None,
) -> dict[str, list[float]]:
    """[INF] Adaptive group testing of permutation drops.

    The fields are cut into seeded random groups of ``size``; each group is permuted at once
    (every member by its own permutation, :func:`field_permutation`) and its drop measured over
    the repeats. A group whose drop passes ``tolerance`` and its repeats' noise
    (:func:`_drops_something`) is halved and each half measured,
    down to single fields; a group that does not is left whole, and each member gets the
    group's drop divided by its size. A field reached alone gets exactly the drops of
    per-field permutation importance (the same permutations). Passes: F / size groups plus
    about 2 log2(size) per field that matters, against F passes one field at a time; what is
    not exact is the order among the fields of a group that dropped nothing (they share its
    small drop), and a field whose drop only shows together with a partner's in the same group
    is counted to the group.
    """
    order = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x6A0]).permutation(len(features))
    shuffled = [features[i] for i in order]
    pending = [shuffled[i : i + size] for i in range(0, len(shuffled), size)]
    out: dict[str, list[float]] = {}
    while pending:
        group = pending.pop()
        drops = [group_drop(group, r) for r in range(repeats)]
        if len(group) == 1:
            out[group[0]] = drops
        elif _drops_something(drops, tolerance):
            half = len(group) // 2
            pending.extend([group[half:], group[:half]])
        else:
            for f in group:
                out[f] = [d / len(group) for d in drops]
                if grouped is not None:
                    grouped[f] = len(group)
    return {f: out[f] for f in features}


def permutation_importance(
    model: RankingModel,
    data: EncodedData,
    repeats: int = 5,
    seed: int = 0,
    batch_size: int = 8192,
    features: list[str] | None = None,
) -> tuple[dict[str, float], dict[str, float], float]:
    """Permutation importance of every seam field of a trained ``model`` on ``data``.

    The sparse arch runs once over ``data`` (``model.eval()``, no grad); for each field and
    repeat the field is permuted over the whole split and only ``model.seam`` +
    ``model.interact`` run again, in chunks of ``batch_size`` rows. The model's training flags
    are restored afterwards.

    Args:
        model: trained ranking model (any backbone, plain or fused kernel).
        data: the evaluation split (use validation, never test, for selection).
        repeats: R permutations per field.
        seed: seed of the permutations (see :func:`field_permutation`).
        batch_size: rows per chunk.
        features: fields to score (default: every seam field, :func:`seam_fields`).

    Returns:
        ``(mean_drop, std_drop, base_auc)``: ``mean_drop[f] = AUC − mean_r AUC_r(f)``,
        ``std_drop[f]`` its standard deviation over the R repeats (ddof 0), ``base_auc`` the
        unpermuted AUC. :func:`permutation_drops` gives the per-repeat drops.

    Memory: the cached seam holds N x (Σ D_f + D_dense) floats (60k rows x 300 columns = 72 MB).
    """
    base, drops = permutation_drops(model, data, repeats, seed, batch_size, features)
    mean = {f: float(np.mean(d)) for f, d in drops.items()}
    std = {f: float(np.std(d)) for f, d in drops.items()}
    return mean, std, base


#: rows permutation importance scores of a streamed split when ``max_rows`` is None
STREAM_MAX_ROWS = 500_000

#: the splits permutation importance may score (never ``test``: it stays for the final model)
ScoredSplit = Literal["val", "train"]


@dataclass
class PermutationImportance(ImportanceMethod):
    """Permutation importance of a model trained once by the recipe, scored on a held-out split.

    Args:
        repeats: R permutations per field.
        split: the split scored (``val``; ``test`` is refused, it stays untouched for the
            final evaluation of the selected model).
        seed: seed of the permutations (the fit uses the recipe's ``seed_everything``).
        max_epochs: override the recipe's ``trainer.max_epochs`` (None: the recipe's).
        batch_size: rows per evaluation chunk.
        tracking: log the fit to MLflow.
        leakage_threshold: features of the training rows scoring at least this x a copy of the
            label (OutRank's check) are left out of the fit and listed as excluded; 0 turns the
            screen off.
        max_rows: score a seeded uniform sample of at most this many rows of the split
            (seeded by ``seed``). None: the whole split in memory, and :data:`STREAM_MAX_ROWS`
            rows of a streamed one (see the module docstring).
        id_screen: rank ID-like features with no signal beyond chance on the training rows
            after all the others (:func:`~selection.base.screen_memorisable`).
        group_size: fields permuted together in a first-level group (None: each field alone up
            to :data:`GROUP_FROM` fields, about sqrt(F) beyond; 1: always alone). See
            :func:`_grouped_drops` for what grouping keeps exact.
        tolerance: a group whose mean AUC drop is above this is split further.
        max_seconds: refuse, right after the first evaluation pass, a ranking whose passes would
            take longer than this (the message names the estimate); None: never.

    The report: score = mean AUC drop, uncertainty = its std over the repeats, width = seam
    width, flag ``within_noise`` when the mean drop is not above two standard errors (and
    ``grouped`` when it is its group's share, ``extras["grouped"]``: field -> group size),
    ``cost_seconds`` = training + evaluation, extras = ``base_auc``, ``train_seconds``,
    ``eval_seconds``, ``repeats``, ``drops`` (per-repeat drops per feature), ``split``.
    """

    name: ClassVar[str] = "permutation"
    repeats: int = 5
    split: ScoredSplit = "val"
    seed: int = 0
    max_epochs: int | None = None
    batch_size: int = 8192
    tracking: bool = True
    leakage_threshold: float = 0.9
    max_rows: int | None = None
    id_screen: bool = True
    group_size: int | None = None
    tolerance: float = 1e-4
    max_seconds: float | None = 3600.0

    def __post_init__(self) -> None:
        split: str = self.split  # options from a plain dict may hold any string
        if split == "test":
            raise ValueError(
                "PermutationImportance.split='test' is refused: select on 'val' and keep test for the final model"
            )
        if split not in get_args(ScoredSplit):
            raise ValueError(f"PermutationImportance.split={split!r} is not one of {list(get_args(ScoredSplit))}")
        if self.repeats < 1:
            raise ValueError(f"PermutationImportance.repeats must be >= 1, got {self.repeats}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ValueError(f"PermutationImportance.max_rows must be >= 1, got {self.max_rows}")

    def rank(
        self, recipe: Recipe, run_name: str = "permutation", parent_run_id: str | None = None
    ) -> ImportanceReport:
        leaks = screen_leakage(recipe, self.leakage_threshold) if self.leakage_threshold > 0 else {}
        fit = recipe.fit(
            features=[n for n in recipe.schema.names if n not in leaks] if leaks else None,
            max_epochs=self.max_epochs,
            run_name=run_name,
            parent_run_id=parent_run_id,
            tracking=self.tracking,
        )
        dm = fit.datamodule
        data = dm.split_data(self.split)  # a view of the shards when streaming: nothing loaded yet
        if data is None:
            available = [k for k in ("train", "val", "test") if dm.has_split(k)]
            raise ValueError(f"the recipe's data has no {self.split!r} split; available: {available}")
        rows = self.max_rows if self.max_rows is not None else (STREAM_MAX_ROWS if isinstance(data, SplitView) else max(len(data), 1))
        report = self.rank_model(
            fit.task.model,
            sample_rows(data, rows, seed=self.seed),
            trained_schema(recipe),
            dataset=recipe.dataset_name,
            train_seconds=fit.seconds,
            extras={
                "test_auc": fit.metrics.get("test_auc"),
                "best_val_auc": fit.metrics.get("best_val_auc"),
                "run_id": fit.run_id,
                "split_rows": len(data),
            },
        )
        report.excluded.update({f: f"{reason} (trained without it)" for f, reason in leaks.items()})
        return screen_memorisable(recipe, report) if self.id_screen else report

    def rank_model(
        self,
        model: RankingModel,
        data: EncodedData,
        schema: Schema | None = None,
        dataset: str = "",
        train_seconds: float = 0.0,
        extras: dict[str, Any] | None = None,
    ) -> ImportanceReport:
        """Rank the seam fields of a trained ``model`` on ``data`` (an encoded held-out split).

        Args:
            model: the trained model.
            data: the split to score.
            schema: schema for widths and kinds (default: the model's).
            dataset: dataset name for the report.
            train_seconds: training time to add to ``cost_seconds``.
            extras: further entries for the report's extras.
        """
        schema = schema or model.schema
        start = time.perf_counter()
        grouped: dict[str, int] = {}
        base, drops = permutation_drops(model, data, repeats=self.repeats, seed=self.seed, batch_size=self.batch_size,
                                        group_size=self.group_size, tolerance=self.tolerance, grouped=grouped,
                                        max_seconds=self.max_seconds)
        mean = {f: float(np.mean(d)) for f, d in drops.items()}
        std = {f: float(np.std(d)) for f, d in drops.items()}
        eval_seconds = time.perf_counter() - start
        widths = feature_widths(schema)
        flags = {f: ("within_noise",) for f in mean if mean[f] <= 2.0 * std[f] / np.sqrt(self.repeats)}
        for f in grouped:
            flags[f] = (*flags.get(f, ()), "grouped")
        excluded = {f: "not a seam field of the model" for f in schema.names if f not in mean}
        return ImportanceReport.from_scores(
            self.name,
            mean,
            uncertainty=std,
            widths={f: widths.get(f, 1) for f in mean},
            kinds={f.name: f.kind.value for f in schema.features},
            flags=flags,
            config=self.describe(),
            cost_seconds=train_seconds + eval_seconds,
            dataset=dataset,
            excluded=excluded,
            extras={
                "base_auc": base,
                "rows": len(data),
                "train_seconds": train_seconds,
                "eval_seconds": eval_seconds,
                "repeats": self.repeats,
                "split": self.split,
                "drops": drops,
                "grouped": grouped,
                **(extras or {}),
            },
        )
