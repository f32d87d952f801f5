"""TorchScript export of a ranking model for serving with plain tensor inputs.

An export directory holds::

    model.pt      TorchScript of ServingModule(model): (values, lengths, dense) -> probabilities B
    schema.json   feature order, kinds, dims, vocabularies (id order, 0 = OOV), hashing rule,
                  dense transforms and statistics, label, versions, metadata
    loader.py     standalone loader (torch + fbgemm_gpu + stdlib): load(dir), predict(records)

Serving inputs for F sparse features and B rows (the KJT is built inside the module)::

    values  = [ids of feature 0 (int64, sum of its lengths), ..., ids of feature F-1]
    lengths = [ids per row of feature 0 (int32/int64, B), ...,  of feature F-1 (B)]
    dense   = B x D_dense float32 (already transformed; D_dense may be 0)

The module is scripted (never traced), so batch sizes and bag lengths are free at call time.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, List, TypeGuard, cast

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.artifacts import export_header
from recsys.data.batching import random_batch
from recsys.data.encoders import Preprocessor
from recsys.data.schema import Schema
from recsys.io import atomic_dir, file_sha256, read_marked_json
from recsys.models.base import EmbeddingKernel, RankingModel, SparseArch

__all__ = [
    "EXPORT_FORMAT",
    "ExportError",
    "ExportResult",
    "ServingModule",
    "check_no_fused_parts",
    "export_model",
    "export_schema",
    "fused_parts",
    "kjt_to_lists",
    "load_exported",
    "eval_mode",
    "model_device",
    "read_export_header",
    "read_export_schema",
    "synthetic_inputs",
    "to_plain_kernel",
]

EXPORT_FORMAT = "salience-export/1"
MODEL_FILE, SCHEMA_FILE, LOADER_FILE = "model.pt", "schema.json", "loader.py"
HASH_RULE = (
    "id = 1 + h % hash_size, h = pandas.util.hash_array(np.array([token], dtype=object), categorize=False)[0]: "
    "siphash-2-4 of the UTF-8 token with key '0123456789123456', then pandas' 64-bit mixer "
    "(h ^= h>>30; h *= 0xBF58476D1CE4E5B9; h ^= h>>27; h *= 0x94D049BB133111EB; h ^= h>>31)"
)
PARITY_ATOL = 1e-5  # export refuses a scripted module further than this from eager (float32 sums)


class ExportError(RuntimeError):
    """The exported module does not reproduce the eager model, or the inputs are inconsistent."""


class ServingModule(nn.Module):
    """A ranking model behind plain tensor inputs; returns click probabilities.

    Args:
        model: a plain-kernel :class:`RankingModel` (see :func:`to_plain_kernel` for fused ones),
            or any scriptable ranking module with ``forward(dense, kjt) -> logits`` (e.g. a
            router over several ranking models); such a module must not hold a fused kernel.
        feature_names: the sparse features of the KJT, in ``values`` / ``lengths`` order;
            default ``model.sparse_names`` (required when the module has no such attribute).
        num_dense: D_dense; default ``model.num_dense`` (required when the module lacks it).

    Call:
        values (List[Tensor]): per sparse feature (model order), flat int64 ids.
        lengths (List[Tensor]): per sparse feature, ids per row (int32 or int64), B each.
        dense (Tensor): B x D_dense float32, D_dense may be 0.

    Returns:
        Tensor: sigmoid(logits), B.

    Example::

        scripted = torch.jit.script(ServingModule(model.eval()))
        probs = scripted([v_user, v_genres], [l_user, l_genres], dense)  # B
    """

    # a real type object (not a string) so TorchScript can type an empty list (dense-only model)
    __annotations__ = {"feature_names": List[str]}  # noqa: RUF012, UP006

    def __init__(
        self, model: nn.Module, feature_names: list[str] | None = None, num_dense: int | None = None
    ) -> None:
        super().__init__()
        if _is_ranking_model(model) and not getattr(model.sparse_arch, "is_plain", True):
            raise ValueError("ServingModule needs the plain embedding kernel: convert with to_plain_kernel(model)")
        check_no_fused_parts(model)
        if feature_names is None and not hasattr(model, "sparse_names"):
            raise ValueError(f"{type(model).__name__} has no sparse_names: pass feature_names=[...]")
        if num_dense is None and not hasattr(model, "num_dense"):
            raise ValueError(f"{type(model).__name__} has no num_dense: pass num_dense=...")
        self.model = model
        # no annotations here: TorchScript infers List[str] / int (annotated `list[str]` warns)
        names = cast("list[str]", model.sparse_names) if feature_names is None else feature_names
        self.feature_names = list(names)  # values order
        self.num_dense = int(cast(int, model.num_dense) if num_dense is None else num_dense)  # D_dense

    def forward(self, values: list[torch.Tensor], lengths: list[torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        n = len(self.feature_names)
        if len(values) != n or len(lengths) != n:
            raise ValueError(
                "expected " + str(n) + " sparse features " + str(self.feature_names) + ", got "
                + str(len(values)) + " values and " + str(len(lengths)) + " lengths"
            )
        if dense.dim() != 2 or dense.size(1) != self.num_dense:
            raise ValueError("dense must be B x " + str(self.num_dense) + ", got " + str(dense.shape))
        batch = dense.size(0)
        for i in range(n):
            if lengths[i].numel() != batch:
                raise ValueError(
                    "lengths of feature " + self.feature_names[i] + " has " + str(lengths[i].numel())
                    + " rows, dense has " + str(batch)
                )
            if int(lengths[i].sum()) != values[i].numel():
                raise ValueError(
                    "feature " + self.feature_names[i] + ": sum(lengths)=" + str(int(lengths[i].sum()))
                    + " != len(values)=" + str(values[i].numel())
                )
        if n > 0:
            flat_values, flat_lengths = torch.cat(values).to(torch.int64), torch.cat(lengths).to(torch.int32)
        else:  # a dense-only model
            flat_values = torch.empty(0, dtype=torch.int64, device=dense.device)
            flat_lengths = torch.empty(0, dtype=torch.int32, device=dense.device)
        kjt = KeyedJaggedTensor(keys=self.feature_names, values=flat_values, lengths=flat_lengths)
        return torch.sigmoid(self.model(dense.to(torch.float32), kjt))


def _is_ranking_model(model: nn.Module) -> TypeGuard[RankingModel]:
    """``model`` carries the :class:`RankingModel` attributes the export reads (schema, sparse
    names, dense width, a sparse arch with its kernel); other modules need an explicit schema."""
    arch = getattr(model, "sparse_arch", None)
    return (
        all(hasattr(model, a) for a in ("schema", "sparse_names", "num_dense"))
        and arch is not None
        and hasattr(arch, "is_fused")
    )


def fused_parts(model: nn.Module) -> list[str]:
    """Names of the submodules of ``model`` on a fused (FBGEMM, unscriptable) embedding kernel."""
    out = []
    for name, m in model.named_modules():
        flag = getattr(m, "is_fused", False)
        if (isinstance(flag, bool) and flag) or type(m).__name__ == "FusedEmbeddingBagCollection":
            out.append(name or "<root>")
    return out


def check_no_fused_parts(model: nn.Module) -> None:
    """Refuse a module that holds fused-kernel parts (only a whole :class:`RankingModel` is converted)."""
    parts = fused_parts(model)
    if parts:
        raise ValueError(
            f"{type(model).__name__} holds fused-kernel embedding parts {parts}: the fused kernel is not "
            "scriptable; build its ranking models with the plain kernel (or convert each with to_plain_kernel)"
        )


# -- inputs --------------------------------------------------------------------------------
def kjt_to_lists(kjt: KeyedJaggedTensor, names: list[str]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-feature (values, lengths) of ``kjt`` in the order ``names`` (not the KJT's order)."""
    per_key = kjt.to_dict()
    return [per_key[n].values() for n in names], [per_key[n].lengths() for n in names]


def synthetic_inputs(
    schema: Schema, batch_size: int, max_bag: int = 3, seed: int = 0
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Random valid serving inputs (see :func:`recsys.data.batching.random_batch`).

    Returns:
        (values per sparse feature int64, lengths per sparse feature int32 B, dense B x D float32).
    """
    batch = random_batch(schema, batch_size, seed=seed, max_bag=max_bag)
    values, lengths = kjt_to_lists(batch.sparse_features, schema.sparse_names)
    return values, lengths, batch.dense_features


def _kjt(names: list[str], values: list[torch.Tensor], lengths: list[torch.Tensor]) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=names, values=torch.cat(values), lengths=torch.cat(lengths).to(torch.int32))


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU when it has none)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@contextmanager
def eval_mode(*modules: nn.Module) -> Iterator[None]:
    """Eval mode and no_grad inside; every submodule's training flag restored after."""
    flags = [[(m, m.training) for m in root.modules()] for root in modules]
    try:
        for root in modules:
            root.eval()
        with torch.no_grad():
            yield
    finally:
        for group in flags:
            for m, flag in group:
                m.training = flag


# -- fused -> plain --------------------------------------------------------------------------
def to_plain_kernel(model: RankingModel, check: bool = True) -> RankingModel:
    """A copy of a fused- or grouped-kernel model with a plain (scriptable) ``EmbeddingBagCollection``.

    The FBGEMM ``FusedEmbeddingBagCollection`` is not scriptable, and the grouped kernel's
    stacked weights are not per-table modules; both have the same state-dict keys as the plain
    one: the copy gets a plain :class:`SparseArch` (same pooling) whose tables
    are the fused weights themselves (they share memory: training the fused model changes the
    copy; ``copy.deepcopy`` the copy for an independent one); everything else is deep-copied.
    A plain model is returned unchanged.

    Args:
        model: the trained model.
        check: compare both models on a random batch and raise :class:`ExportError` when they
            differ by more than ``PARITY_ATOL``.
    """
    fused = model.sparse_arch
    if not isinstance(fused, SparseArch) or fused.is_plain:  # a dense-only model has no tables
        return model
    device = model_device(model)
    # the same settings (pooling, frequency blocks, row schemes), the plain kernel; built on the
    # meta device and given uninitialised memory (never written: no resident pages), then its
    # tables assigned the fused tables' own weights (views of the fused kernel's storage): no new
    # copy of the tables (a filled copy was +0.6 GB at the 45M-row scale benchmark, an
    # initialised table plus a cloned state dict +1.1 GB)
    with torch.device("meta"):
        plain = SparseArch(model.schema, dataclasses.replace(fused.config, kernel=EmbeddingKernel.PLAIN))
    plain = plain.to_empty(device=device)
    plain.load_state_dict({k: v.detach() for k, v in fused.state_dict().items()}, assign=True)
    out = copy.deepcopy(model, memo={id(fused): plain})  # the fused arch is never copied
    plain.train(fused.training)
    if check:
        values, lengths, dense = synthetic_inputs(model.schema, 16)
        kjt, dense = _kjt(model.sparse_names, values, lengths).to(device), dense.to(device)
        with eval_mode(model, out):
            diff = float((model(dense, kjt) - out(dense, kjt)).abs().max())
        if not diff <= PARITY_ATOL:
            raise ExportError(f"plain-kernel copy differs from the fused model by {diff:.3g} (> {PARITY_ATOL})")
    return out


# -- export ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_model` wrote.

    Attributes:
        output_dir: the export directory.
        model_path / schema_path / loader_path: its three files.
        max_abs_diff: max |eager - scripted| probability on random batches at export time.
        converted_from_fused: the model used the fused (or grouped) kernel and was rebuilt on the plain one.
    """

    output_dir: Path
    model_path: Path
    schema_path: Path
    loader_path: Path
    max_abs_diff: float
    converted_from_fused: bool


def _model_schema(model: nn.Module, preprocessor: Preprocessor, schema: Schema | None) -> Schema:
    if schema is not None:
        return schema
    if _is_ranking_model(model):
        return model.schema
    return preprocessor.fitted_schema


def export_schema(model: nn.Module, preprocessor: Preprocessor, schema: Schema | None = None) -> Schema:
    """The preprocessor's fitted schema restricted to, and ordered like, the model's features.

    Embedding dims come from the model (it may have been built with other dims); vocabulary
    sizes must agree. Raises ``ValueError`` when model and preprocessor do not match.

    Args:
        schema: the model's input schema; default ``model.schema`` for a :class:`RankingModel`,
            the preprocessor's fitted schema for another ranking module.
    """
    fitted = preprocessor.fitted_schema
    model_schema = _model_schema(model, preprocessor, schema)
    missing = [n for n in model_schema.names if n not in fitted.names]
    if missing:
        raise ValueError(f"model features {missing} are not in the preprocessor's schema {fitted.names}")
    feats = []
    for f in model_schema.features:
        p = fitted[f.name]
        if p.kind is not f.kind or (f.is_sparse and p.num_embeddings != f.num_embeddings):
            raise ValueError(
                f"feature {f.name!r}: model has kind={f.kind.value}, num_embeddings={f.num_embeddings}; "
                f"preprocessor has kind={p.kind.value}, num_embeddings={p.num_embeddings}"
            )
        feats.append(replace(p, embedding_dim=f.embedding_dim))
    out = replace(fitted, features=tuple(feats))
    order = list(cast("list[str]", model.sparse_names)) if hasattr(model, "sparse_names") else model_schema.sparse_names
    if out.sparse_names != order:
        raise ValueError(f"sparse order {out.sparse_names} != model order {order}")
    return out


def _trained_kernel(model: nn.Module) -> str:
    if _is_ranking_model(model):
        return model.sparse_arch.kernel.value
    return EmbeddingKernel.PLAIN.value  # other ranking modules hold no fused part (checked)


#: where a vocabulary's JSON list goes in ``schema.json``'s text (see :func:`_schema_text`)
_VOCAB_MARK = "@@salience-vocabulary-{}@@"
_VOCAB_CHUNK = 1 << 16


def _tokens_json(tokens: Any) -> str:
    """A vocabulary's tokens as a JSON list, built chunk by chunk from its Arrow array: a Python
    string exists for one chunk of tokens at a time, not for all of them (9.25M tokens at the
    45M-row scale benchmark held ~0.6 GB as Python strings)."""
    arrow = tokens.arrow
    parts = [json.dumps(arrow.slice(i, _VOCAB_CHUNK).to_pylist(), ensure_ascii=False)[1:-1]
             for i in range(0, len(arrow), _VOCAB_CHUNK)]
    return "[" + ", ".join(p for p in parts if p) + "]"


def _schema_text(info: dict[str, Any], pre: Preprocessor, schema: Schema) -> str:
    """``schema.json``'s text: ``info`` (its vocabularies as marks) with each mark replaced by
    the vocabulary's JSON list."""
    text = json.dumps(info, indent=1, ensure_ascii=False) + "\n"
    for i, f in enumerate(schema.sparse):
        if f.hash_size is None:
            mark = json.dumps(_VOCAB_MARK.format(i))
            if text.count(mark) != 1:
                raise ExportError(f"schema.json: the vocabulary mark of {f.name!r} is not unique in the text")
            text = text.replace(mark, _tokens_json(pre.vocabularies[f.name].tokens))
    return text


def _schema_json(model: nn.Module, pre: Preprocessor, schema: Schema, metadata: dict[str, Any],
                 precision: dict[str, Any]) -> dict[str, Any]:
    return {
        **export_header(EXPORT_FORMAT, model),
        "trained_kernel": _trained_kernel(model),
        "label": schema.label,
        "sparse_features": schema.sparse_names,
        "dense_features": schema.dense_names,
        "dense_widths": schema.dense_widths,
        "dense_columns": schema.dense_columns,
        "schema": schema.to_dict(),
        "vocabulary_rule": "id = 1 + index in the token list (descending training frequency); 0 = out of vocabulary",
        "hashing": {f.name: {"hash_size": f.hash_size, "rule": HASH_RULE} for f in schema.sparse if f.hash_size},
        "dense_stats": {f.name: list(pre.dense_stats[f.name]) for f in schema.dense},
        "dense_rule": "missing/NaN/inf -> fill_value; log1p: log1p(max(x, 0)); standardize: (x - mean) / std "
                      "(a vector feature: each of its D values, with one mean and std over all of them)",
        "embedding_precision": precision,
        "serving_signature": {
            "forward": "forward(values: List[Tensor], lengths: List[Tensor], dense: Tensor) -> Tensor",
            "values": "per sparse feature in sparse_features order: flat int64 ids",
            "lengths": "per sparse feature: ids per row, int32 or int64, B each",
            "dense": "B x sum(dense_widths) float32, after the dense transforms: a scalar feature's column, a vector "
                     "feature's D columns (dense_columns), in dense_features order",
            "output": "click probabilities, B",
        },
        "metadata": metadata,
        # last, so that read_export_header stops before the tokens
        "vocabularies": {f.name: _VOCAB_MARK.format(i) for i, f in enumerate(schema.sparse) if f.hash_size is None},
    }


def export_model(
    model: nn.Module,
    preprocessor: Preprocessor,
    output_dir: str | Path,
    metadata: dict[str, Any] | None = None,
    schema: Schema | None = None,
    precision: str | Mapping[str, str] = "fp32",
) -> ExportResult:
    """Script ``model`` behind :class:`ServingModule` and write an export directory atomically.

    Writes ``model.pt`` (TorchScript; ``schema.json`` is also embedded as an extra file),
    ``schema.json`` and ``loader.py`` into a temp folder, checks the scripted module against
    the eager model on random batches, then renames the folder onto ``output_dir``. Fused
    models are first rebuilt on the plain kernel (:func:`to_plain_kernel`); a model on an
    accelerator is exported from a CPU copy. The model's training flags are left as they were.

    Args:
        model: trained ranking model (plain or fused kernel), or any scriptable ranking module
            with ``forward(dense, kjt) -> logits`` on plain-kernel parts (e.g. a router over
            several ranking models; fused parts are refused with ``ValueError``).
        preprocessor: the fitted preprocessor the model was trained with.
        output_dir: export directory (replaced if it holds a previous export).
        metadata: JSON-able extras stored in ``schema.json`` (run id, metrics, ...).
        schema: the model's input schema (sparse order = the KJT keys it reads, dense width);
            default ``model.schema`` for a :class:`RankingModel`, else the preprocessor's
            fitted schema.
        precision: storage of the embedding tables (:mod:`recsys.export.quantize`): ``fp32``
            (as trained), ``fp16``, ``int8`` or ``int4``, optionally with per-feature overrides
            (``"int8,C3=int4"``). A lower precision exports the quantized model and checks the
            scripted module against the eager *quantized* one (same kernels: ``PARITY_ATOL``);
            ``schema.json`` records it (``embedding_precision``: each table's precision, the
            embedding bytes and their fp32 bytes).

    Returns:
        ExportResult with the paths and the export-time parity.
    """
    output_dir = Path(output_dir)
    ranking = _is_ranking_model(model)
    if ranking:
        serving_args: dict[str, Any] = {}
    else:
        check_no_fused_parts(model)
        model_schema = _model_schema(model, preprocessor, schema)
        serving_args = {"feature_names": model_schema.sparse_names, "num_dense": model_schema.dense_width}
    schema = export_schema(model, preprocessor, schema)
    plain = to_plain_kernel(cast(RankingModel, model)) if ranking else model
    device = model_device(model)
    cpu_model = plain if device.type == "cpu" else (copy.deepcopy(plain) if plain is model else plain).cpu()
    reference = model  # what the scripted module must reproduce
    record: dict[str, Any] = {"tables": {}, "bytes": 0, "fp32_bytes": 0}
    if ranking:
        cpu_model, record = _quantized(cast(RankingModel, cpu_model), precision)
        if cpu_model is not plain:  # the eager quantized model, on the CPU
            reference, device = cpu_model, torch.device("cpu")
    elif precision != "fp32":
        raise ValueError(f"precision={precision!r} needs a RankingModel (its sparse arch holds the tables)")
    info = _schema_json(model, preprocessor, schema, dict(metadata or {}), record)
    info_text = _schema_text(info, preprocessor, schema)
    with eval_mode(model, reference, cpu_model):
        scripted = torch.jit.script(ServingModule(cpu_model, **serving_args))
        diff = 0.0
        for batch_size in (1, 5):
            values, lengths, dense = synthetic_inputs(schema, batch_size, 3, seed=1234 + batch_size)
            kjt = _kjt(schema.sparse_names, values, lengths).to(device)
            eager = torch.sigmoid(reference(dense.to(device), kjt)).cpu()
            diff = max(diff, float((scripted(values, lengths, dense) - eager).abs().max()))
    if not diff <= PARITY_ATOL:
        raise ExportError(f"scripted module differs from the eager model by {diff:.3g} (> {PARITY_ATOL})")
    with atomic_dir(output_dir, SCHEMA_FILE) as tmp:
        torch.jit.save(scripted, str(tmp / MODEL_FILE), _extra_files={SCHEMA_FILE: info_text})
        (tmp / SCHEMA_FILE).write_text(info_text, encoding="utf-8")
        shutil.copyfile(Path(__file__).with_name("_loader_template.py"), tmp / LOADER_FILE)
        (tmp / "MANIFEST.json").write_text(
            json.dumps({f: file_sha256(tmp / f) for f in (MODEL_FILE, SCHEMA_FILE, LOADER_FILE)}, indent=1) + "\n"
        )
    return ExportResult(
        output_dir=output_dir,
        model_path=output_dir / MODEL_FILE,
        schema_path=output_dir / SCHEMA_FILE,
        loader_path=output_dir / LOADER_FILE,
        max_abs_diff=diff,
        converted_from_fused=ranking and not getattr(cast(RankingModel, model).sparse_arch, "is_plain", True),
    )


def _quantized(model: RankingModel, precision: str | Mapping[str, str]) -> tuple[RankingModel, dict[str, Any]]:
    """The model at ``precision`` and what ``schema.json`` records of it."""
    from recsys.export.quantize import embedding_bytes, quantize_model, resolve_precision

    arch = model.sparse_arch
    if not isinstance(arch, SparseArch):
        return model, {"tables": {}, "bytes": 0, "fp32_bytes": 0}
    plan = resolve_precision(arch, precision)
    record = {"tables": plan.to_dict(), "bytes": embedding_bytes(arch, plan), "fp32_bytes": embedding_bytes(arch)}
    return quantize_model(model, plan), record


def read_export_schema(export_dir: str | Path) -> dict[str, Any]:
    """The parsed ``schema.json`` of an export directory (checks the format marker)."""
    return read_marked_json(export_dir, SCHEMA_FILE, EXPORT_FORMAT, "an export directory")


#: the text that starts ``schema.json``'s last key (indent 1: a top-level key; the token lists are one line each)
_VOCABULARIES_KEY = '\n "vocabularies": '
#: how far :func:`read_export_header` looks for it before parsing the whole file (an export
#: written before the key moved last)
_HEADER_LIMIT = 16 << 20


def read_export_header(export_dir: str | Path) -> dict[str, Any]:
    """``schema.json`` of an export directory without its ``vocabularies``: the text before that
    key (written last, right after ``metadata``) is parsed, so the tokens never become Python
    strings (the 45M-row Criteo-shaped export holds 9.25M of them, ~0.6 GB). What checks
    kernels, precisions and feature names reads; an older export, with the key before
    ``metadata``, is parsed whole.
    """
    path = Path(export_dir) / SCHEMA_FILE
    if not path.is_file():
        return read_export_schema(export_dir)  # its error: not an export directory
    head = ""
    with open(path, encoding="utf-8") as fh:
        while len(head) < _HEADER_LIMIT and (block := fh.read(1 << 16)):
            start = max(0, len(head) - len(_VOCABULARIES_KEY))
            head += block
            at = head.find(_VOCABULARIES_KEY, start)
            if at >= 0:
                info = json.loads(head[:at].rstrip().removesuffix(",") + "\n}")
                if "metadata" in info:  # written just before the vocabularies; older exports wrote it after them
                    if info.get("format") != EXPORT_FORMAT:
                        raise ValueError(f"{path}: format {info.get('format')!r} is not {EXPORT_FORMAT!r}")
                    return info
                break
    info = read_export_schema(export_dir)
    info.pop("vocabularies", None)
    return info


def load_exported(export_dir: str | Path) -> torch.jit.ScriptModule:
    """The exported TorchScript module in eval mode (imports fbgemm_gpu first for its ops)."""
    import fbgemm_gpu  # noqa: F401  registers fbgemm:: ops used by the scripted KJT code

    from recsys.export._loader_template import check_kernels

    check_kernels(read_export_header(export_dir), export_dir)
    module = torch.jit.load(str(Path(export_dir) / MODEL_FILE), map_location="cpu")
    module.eval()
    return module
