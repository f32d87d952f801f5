"""Quantized embedding tables for serving: fp16, int8 and int4 rows on FBGEMM's inference kernel.

A trained model's tables are stored row by row at a lower precision and looked up by FBGEMM's
``IntNBitTableBatchedEmbeddingBagsCodegen`` (the kernel TorchRec's quantized
``EmbeddingBagCollection`` runs on, CPU and CUDA)::

    fp32 / fp16   each row as is (4 / 2 bytes per value)
    int8 / int4   each row min-max quantized to 2^bits levels, plus its own fp16 scale and
                  bias (4 bytes per row): value ~ scale * q + bias

:class:`QuantizedEmbeddingBags` replaces a plain ``EmbeddingBagCollection`` inside a model's
:class:`~recsys.models.base.SparseArch` (same call, same ``KeyedTensor`` out), so the rest of
the model, the frequency blocks and the :class:`~recsys.export.serving.ServingModule` are
unchanged and the whole model scripts as before. TorchRec's own quantized collection is not
used directly: its forward reads an attribute by a non-literal name, which TorchScript refuses
(TorchRec scripts it after ``torch.fx`` tracing, which Salience never applies to a KJT model).

    quantized = quantize_model(model, "int8")            # every table int8
    quantized = quantize_model(model, "int8,C3=int4")     # one table overridden
    export_model(model, preprocessor, "exports/int8", precision="int8")

Kernel limits (FBGEMM's row layout): int8 rows need an even dim, int4 rows a dim divisible by
4; :func:`resolve_precision` names the table otherwise.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from enum import Enum, unique
from typing import List, Mapping  # noqa: UP035

import torch
from torch import nn
from torchrec.modules.embedding_configs import PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from recsys.models.base import RankingModel, SparseArch

__all__ = [
    "Precision",
    "PrecisionError",
    "PrecisionPlan",
    "QuantizedEmbeddingBags",
    "embedding_bytes",
    "inference_ops_available",
    "quantize_model",
    "resolve_precision",
]


@unique
class Precision(str, Enum):
    """Storage of an embedding row."""

    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bits(self) -> int:
        return {"fp32": 32, "fp16": 16, "int8": 8, "int4": 4}[self.value]

    @property
    def row_overhead(self) -> int:
        """Bytes per row besides the values: the fp16 scale and bias of an integer row."""
        return 4 if self.bits < 16 else 0

    @property
    def dim_multiple(self) -> int:
        """The kernel's row layout needs dims divisible by this."""
        return {"fp32": 1, "fp16": 1, "int8": 2, "int4": 4}[self.value]

    def row_bytes(self, dim: int) -> int:
        return dim * self.bits // 8 + self.row_overhead


class PrecisionError(ValueError):
    """A precision setting that the tables or the kernel cannot take (names the table or key)."""


@dataclass(frozen=True)
class PrecisionPlan:
    """Precision of every table of a model (table name -> :class:`Precision`)."""

    tables: Mapping[str, Precision]

    @property
    def is_fp32(self) -> bool:
        return all(p is Precision.FP32 for p in self.tables.values())

    def to_dict(self) -> dict[str, str]:
        return {t: p.value for t, p in self.tables.items()}


def _precision(text: str, key: str) -> Precision:
    try:
        return Precision(text.strip().lower())
    except ValueError:
        raise PrecisionError(f"{key}={text!r} is not one of {[p.value for p in Precision]}") from None


def resolve_precision(arch: SparseArch, spec: str | Precision | Mapping[str, str | Precision]) -> PrecisionPlan:
    """The per-table precision a spec asks for, checked against the tables' dims.

    Args:
        arch: the model's sparse arch (its tables ``t_<feature>`` / ``t_<feature>@<block>``).
        spec: one precision for every table (``"int8"``), or that followed by per-feature
            overrides (``"int8,C3=int4,user=fp16"``; a feature's override covers all its
            blocks), or a mapping ``{feature or table or "default": precision}``.

    Raises:
        PrecisionError: an unknown precision or feature, or a table whose dim the kernel cannot
            store at the precision asked (the message names the table and its dim).
    """
    if isinstance(spec, Mapping):
        items = {str(k): str(v.value if isinstance(v, Precision) else v) for k, v in spec.items()}
        default = _precision(items.pop("default", "fp32"), "precision")
    else:
        text = spec.value if isinstance(spec, Precision) else str(spec)
        parts = [p for p in text.split(",") if p.strip()]
        if not parts or "=" in parts[0]:
            raise PrecisionError(f"precision={text!r}: start with the default precision, e.g. 'int8' or 'int8,C3=int4'")
        default = _precision(parts[0], "precision")
        items = {}
        for part in parts[1:]:
            name, sep, value = part.partition("=")
            if not sep:
                raise PrecisionError(f"precision override {part!r}: expected FEATURE=PRECISION")
            items[name.strip()] = value.strip()
    dims = _table_dims(arch)
    features = set(arch.feature_names)
    out = dict.fromkeys(dims, default)
    for name, value in items.items():
        p = _precision(value, f"precision.{name}")
        if name in dims:
            out[name] = p
        elif name in features:
            for t in dims:
                if t == SparseArch.table_name(name) or t.startswith(f"t_{name}@"):
                    out[t] = p
        else:
            raise PrecisionError(f"precision override {name!r}: not a sparse feature of the model ({sorted(features)})")
    for table, p in out.items():
        if dims[table] % p.dim_multiple:
            raise PrecisionError(
                f"table {table} has dim {dims[table]}: {p.value} rows need a dim divisible by {p.dim_multiple} "
                f"(FBGEMM's row layout); override it, e.g. --precision {default.value},{_feature_of(table)}=int8 or =fp16"
            )
    return PrecisionPlan(out)


def _feature_of(table: str) -> str:
    return table.removeprefix("t_").split("@")[0]


def _plain_collection(arch: SparseArch) -> EmbeddingBagCollection:
    ebc = arch.embedding_bag_collection
    if not isinstance(ebc, EmbeddingBagCollection):
        raise PrecisionError(
            f"quantization needs the plain EmbeddingBagCollection, got {type(ebc).__name__} "
            "(convert a fused or grouped model with recsys.export.to_plain_kernel first)"
        )
    return ebc


def _table_dims(arch: SparseArch) -> dict[str, int]:
    return {c.name: c.embedding_dim for c in _plain_collection(arch).embedding_bag_configs()}


def embedding_bytes(arch: SparseArch, plan: PrecisionPlan | None = None) -> int:
    """Bytes of the model's embedding tables stored at ``plan`` (None: fp32)."""
    ebc = _plain_collection(arch)
    total = 0
    for c in ebc.embedding_bag_configs():
        p = Precision.FP32 if plan is None else plan.tables[c.name]
        total += c.num_embeddings * p.row_bytes(c.embedding_dim)
    return total


def inference_ops_available() -> bool:
    """This fbgemm_gpu build has the quantized (int-N) embedding lookup op."""
    import fbgemm_gpu  # noqa: F401  registers the fbgemm ops

    return hasattr(torch.ops.fbgemm, "int_nbit_split_embedding_codegen_lookup_function")


def _quantized_rows(weight: torch.Tensor, precision: Precision) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FBGEMM's row storage of ``weight`` (rows x dim float32): (uint8 rows, uint8 scale/bias or None)."""
    w = weight.detach().float().contiguous().cpu()
    if precision is Precision.FP32:
        return w.view(torch.uint8), None
    if precision is Precision.FP16:
        return w.half().view(torch.uint8), None
    fused = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(w, precision.bits)
    return fused[:, :-4].contiguous(), fused[:, -4:].contiguous()  # values, then fp16 scale and bias


class QuantizedEmbeddingBags(nn.Module):
    """A plain ``EmbeddingBagCollection`` stored at lower precision (same call, same output).

    Tables with the same pooling share one FBGEMM ``IntNBitTableBatchedEmbeddingBagsCodegen``
    (tables of different precisions can share it).

    Args:
        ebc: the trained plain collection (one feature per table, as SparseArch builds).
        plan: the precision of each of its tables.

    Call:
        kjt: KeyedJaggedTensor whose keys are the collection's features (any order).

    Returns:
        KeyedTensor: feature -> B x D_table pooled embeddings, in the collection's feature order.
    """

    def __init__(self, ebc: EmbeddingBagCollection, plan: PrecisionPlan) -> None:
        super().__init__()
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen

        if not inference_ops_available():
            raise PrecisionError("this fbgemm_gpu build lacks the quantized embedding ops (int_nbit_split_embedding_*)")
        configs = list(ebc.embedding_bag_configs())
        groups: dict[PoolingType, list[int]] = {}
        for i, c in enumerate(configs):
            if len(c.feature_names) != 1:
                raise PrecisionError(f"table {c.name}: one feature per table expected, got {c.feature_names}")
            groups.setdefault(c.pooling, []).append(i)
        self.feature_names: List[str] = []  # noqa: UP006  lookup order (grouped by pooling)
        self.dims: List[int] = []  # noqa: UP006
        self.group_sizes: List[int] = []  # noqa: UP006
        self.tables = nn.ModuleList()
        for pooling, members in groups.items():
            specs, weights = [], []
            for i in members:
                c = configs[i]
                p = plan.tables[c.name]
                specs.append((c.name, c.num_embeddings, c.embedding_dim, SparseType[p.name], EmbeddingLocation.HOST))
                weights.append(_quantized_rows(ebc.embedding_bags[c.name].weight, p))
                self.feature_names.append(c.feature_names[0])
                self.dims.append(c.embedding_dim)
            self.tables.append(IntNBitTableBatchedEmbeddingBagsCodegen(
                specs, pooling_mode=PoolingMode.MEAN if pooling == PoolingType.MEAN else PoolingMode.SUM,
                device="cpu", output_dtype=SparseType.FP32, weight_lists=weights,
            ))
            self.group_sizes.append(len(members))
        self.output_names: List[str] = [c.feature_names[0] for c in configs]  # noqa: UP006  the EBC's order
        self._order: List[int] = [self.feature_names.index(f) for f in self.output_names]  # noqa: UP006

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedTensor:
        keys = kjt.keys()
        if keys != self.feature_names:
            kjt = kjt.permute([keys.index(k) for k in self.feature_names])
        pooled: List[torch.Tensor] = []  # noqa: UP006
        parts = kjt.split(self.group_sizes)
        for i, table in enumerate(self.tables):
            part = parts[i]
            out = table(part.values(), part.offsets())
            pooled.extend(torch.split(out, self.dims[len(pooled):len(pooled) + self.group_sizes[i]], dim=1))
        return KeyedTensor(keys=self.output_names, length_per_key=[self.dims[j] for j in self._order],
                           values=torch.cat([pooled[j] for j in self._order], dim=1))


def quantize_model(model: RankingModel, precision: str | Precision | Mapping[str, str | Precision] | PrecisionPlan) -> RankingModel:
    """A copy of a plain-kernel ``model`` whose embedding tables are stored at ``precision``
    (see :func:`resolve_precision`); an all-fp32 plan returns ``model`` itself. The copy is for
    inference (its tables are not trainable)."""
    arch = model.sparse_arch
    if not isinstance(arch, SparseArch):  # a dense-only model
        return model
    plan = precision if isinstance(precision, PrecisionPlan) else resolve_precision(arch, precision)
    if plan.is_fp32:
        return model
    ebc = _plain_collection(arch)
    quantized = QuantizedEmbeddingBags(ebc, plan)
    out = copy.deepcopy(model, memo={id(ebc): quantized})
    out.eval()
    return out

