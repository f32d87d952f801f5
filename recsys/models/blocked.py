"""Frequency-blocked embedding tables: one table per (feature, contiguous id range).

DNIS (methods.md 3.3) gives a feature's vocabulary, ordered by descending frequency, several
*frequency blocks* ``[start, stop)`` each with its own width ``d_b``. A blocked feature ``f``
is stored as one ``EmbeddingBagConfig`` per block (table ``t_<f>@<b>``, ``stop - start`` rows,
``d_b`` columns), so the parameter count is exactly ``sum_b (stop_b - start_b) * d_b``.

The lookup keeps the model's interface ({name: B x D_f}, D_f = widest block):

    KJT(f: ids)  ──split──►  KJT(f@0: ids in block 0, f@1: ids - start_1, ...)  ──EBC──►
    {f@b: B x d_b}  ──zero-pad each to D_f, sum over blocks (/ row length for mean)──►  {f: B x D_f}

Zero-padding a narrow block to the feature's width is the same as a full D_f table whose rows
in block ``b`` are zero beyond column ``d_b`` (DNIS's sorted-dimension derivation). The split
runs inside the model, so the serving inputs (per-feature values / lengths) are unchanged, and
it is TorchScript-scriptable. Id 0 (OOV) is row 0 of block 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Dict, List, Tuple

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.data.schema import Schema
from recsys.models.rows import HASH_MULTIPLIER, RowScheme, qr_key, sparse_specs_for

__all__ = ["BLOCKS_KEY", "Block", "BlockRouter", "block_key", "check_blocks"]

#: the config key the errors name (``salience fit --model.embedding_blocks=...``)
BLOCKS_KEY = "model.embedding_blocks"

#: one resolved block: (start, stop, dim), stop always a concrete id (one past the last row)
Block = Tuple[int, int, int]


def block_key(feature: str, block: int) -> str:
    """KJT key (and, prefixed with ``t_``, table name) of ``feature``'s block ``block``."""
    return f"{feature}@{block}"


def _as_triple(raw: Any, where: str) -> tuple[Any, Any, Any]:
    if isinstance(raw, Mapping):
        if not {"start", "stop", "dim"} <= set(raw):
            raise ValueError(f"{where}: a block needs keys start, stop, dim; got {dict(raw)!r}")
        return raw["start"], raw["stop"], raw["dim"]
    if hasattr(raw, "start") and hasattr(raw, "stop") and hasattr(raw, "dim"):  # a FrequencyBlock
        return raw.start, raw.stop, raw.dim
    if isinstance(raw, Sequence) and not isinstance(raw, str) and len(raw) == 3:
        return raw[0], raw[1], raw[2]
    raise ValueError(f"{where}: a block is [start, stop, dim] (stop -1 or null = to the end of the table); got {raw!r}")


def _int(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"{where}: {what} must be an integer, got {value!r}")
    return int(value)


def check_blocks(
    raw: Mapping[str, Any] | None, schema: Schema, key: str = BLOCKS_KEY, align: int = 1
) -> dict[str, tuple[Block, ...]]:
    """Validate and resolve per-feature frequency blocks against a fitted schema.

    Args:
        raw: feature -> list of blocks, each ``[start, stop, dim]`` (or a ``{start, stop, dim}``
            mapping, or an object with those attributes); ``stop`` -1 or None on the last
            block means "to the end of the table".
        schema: fitted schema (gives each table's rows and the feature's width ``D_f``).
        key: config key the errors name.
        align: every block dim must be a multiple of this (4 for the fused FBGEMM kernel).

    Returns:
        feature -> ((start, stop, dim), ...) with concrete stops, contiguous from 0 to the
        table's row count; features in schema order.

    Raises:
        ValueError naming ``key``: unknown or dense feature, empty list, a gap or overlap, a
        block that does not end the table, a dim below 1 or misaligned, a widest block that is
        not the feature's embedding dim.
    """
    if not raw:
        return {}
    sparse = sparse_specs_for(raw, schema, key, "[[start, stop, dim], ...]")
    unknown = [str(n) for n in raw if n not in sparse]
    if unknown:
        raise ValueError(
            f"{key}: feature(s) {unknown} are not sparse features of the schema; sparse features: {sorted(sparse)}"
        )
    out: dict[str, tuple[Block, ...]] = {}
    for name in [f.name for f in schema.sparse if f.name in raw]:
        spec = sparse[name]
        rows = int(spec.num_embeddings or 0)
        items = raw[name]
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
            raise ValueError(f"{key}.{name}: needs a non-empty list of [start, stop, dim] blocks, got {items!r}")
        blocks: list[Block] = []
        expected = 0
        for i, item in enumerate(items):
            where = f"{key}.{name}[{i}]"
            start_raw, stop_raw, dim_raw = _as_triple(item, where)
            start = _int(start_raw, "start", where)
            last = i == len(items) - 1
            if stop_raw is None or (not isinstance(stop_raw, bool) and stop_raw == -1):
                if not last:
                    raise ValueError(f"{where}: only the last block may run to the end of the table (stop -1 or null)")
                stop = rows
            else:
                stop = _int(stop_raw, "stop", where)
            dim = _int(dim_raw, "dim", where)
            if start != expected:
                kind = "a gap" if start > expected else "an overlap"
                raise ValueError(
                    f"{where}: blocks must be contiguous id ranges from 0; this one starts at {start} "
                    f"but the previous one ends at {expected} ({kind})"
                )
            if stop <= start:
                raise ValueError(f"{where}: an empty or reversed id range [{start}, {stop})")
            if dim < 1:
                raise ValueError(f"{where}: dim must be >= 1, got {dim}")
            if dim % align:
                raise ValueError(f"{where}: dim {dim} is not a multiple of {align} (the fused FBGEMM kernel needs that)")
            blocks.append((start, stop, dim))
            expected = stop
        if expected != rows:
            raise ValueError(
                f"{key}.{name}: the blocks end at id {expected} but the table has {rows} rows; "
                f"end the last block at {rows} or with stop -1 / null"
            )
        widest = max(d for _, _, d in blocks)
        if widest != spec.embedding_dim:
            raise ValueError(
                f"{key}.{name}: the widest block has dim {widest} but the feature's embedding dim is "
                f"{spec.embedding_dim}; set data.embedding_dims.{name} to {widest} (a DimensionPlan's "
                f"to_config_overrides() sets both)"
            )
        out[name] = tuple(blocks)
    return out


class BlockRouter(nn.Module):
    """Splits blocked features' ids into per-block KJT keys and merges the pooled blocks back.

    Args:
        feature_names: the sparse features, in model order.
        blocks: resolved blocks (see :func:`check_blocks`); features not named keep one table.
        widths: feature -> D_f.
        mean: the feature bags are mean-pooled (block tables then pool by sum and the merged
            sum is divided by the row's total length).

    ``split(kjt) -> (kjt over table keys, {blocked feature: row lengths})``;
    ``merge(pooled by table key, lengths) -> {feature: B x D_f}`` in feature order.
    With no blocks both are the identity (``merge`` only reorders).
    """

    # real type objects so TorchScript can type empty containers
    __annotations__ = {  # noqa: RUF012
        "feature_names": List[str],  # noqa: UP006
        "table_keys": List[str],  # noqa: UP006
        "starts": Dict[str, List[int]],  # noqa: UP006
        "block_keys": Dict[str, List[str]],  # noqa: UP006
        "widths": Dict[str, int],  # noqa: UP006
        "qr_buckets": Dict[str, int],  # noqa: UP006
        "qr_combine": Dict[str, int],  # noqa: UP006
        "hash_rows": Dict[str, int],  # noqa: UP006
    }

    def __init__(
        self, feature_names: list[str], blocks: Mapping[str, Sequence[Block]], widths: Mapping[str, int], mean: bool = False,
        rows: Mapping[str, RowScheme] | None = None,
    ) -> None:
        super().__init__()
        rows = rows or {}
        self.feature_names = list(feature_names)
        self.starts = {n: [int(b[0]) for b in blocks[n]] for n in self.feature_names if n in blocks}
        self.block_keys = {n: [block_key(n, i) for i in range(len(blocks[n]))] for n in self.feature_names if n in blocks}
        self.widths = {n: int(widths[n]) for n in self.feature_names if n in blocks}
        # row schemes (recsys.models.rows): quotient-remainder pairs and hashed features
        self.qr_buckets = {n: r.buckets for n, r in rows.items() if r.scheme == "qr"}
        self.qr_combine = {n: r.combine_code for n, r in rows.items() if r.scheme == "qr"}
        self.hash_rows = {n: r.rows for n, r in rows.items() if r.scheme == "hash"}
        self.hash_multiplier = HASH_MULTIPLIER  # an attribute: TorchScript reads no module globals
        self.table_keys = [
            k for n in self.feature_names
            for k in self.block_keys.get(n, [qr_key(n, "q"), qr_key(n, "r")] if n in self.qr_buckets else [n])
        ]
        self.reroutes = bool(self.starts) or bool(self.qr_buckets) or bool(self.hash_rows)  # split() rewrites ids
        self.mean = bool(mean)

    def split(self, kjt: KeyedJaggedTensor) -> Tuple[KeyedJaggedTensor, Dict[str, torch.Tensor]]:  # noqa: UP006
        totals: Dict[str, torch.Tensor] = {}  # noqa: UP006
        if not self.reroutes:
            return kjt, totals
        jts = kjt.to_dict()
        values: List[torch.Tensor] = []  # noqa: UP006
        lengths: List[torch.Tensor] = []  # noqa: UP006
        for name in self.feature_names:
            jt = jts[name]
            v = jt.values()
            ln = jt.lengths()
            if name in self.qr_buckets:
                m = self.qr_buckets[name]
                values.append(torch.div(v, m, rounding_mode="floor"))
                values.append(torch.remainder(v, m))
                lengths.append(ln)
                lengths.append(ln)
            elif name in self.hash_rows:
                r = self.hash_rows[name]
                hashed = 1 + torch.remainder(v * self.hash_multiplier, r - 1)
                values.append(torch.where(v == 0, torch.zeros_like(v), hashed))
                lengths.append(ln)
            elif name in self.starts:
                starts = self.starts[name]
                batch = ln.numel()
                rows = torch.repeat_interleave(torch.arange(batch, device=v.device), ln.long())
                bounds = torch.tensor(starts[1:], dtype=v.dtype, device=v.device)
                which = torch.bucketize(v, bounds, right=True)
                for i, start in enumerate(starts):
                    hit = which == i
                    values.append(v[hit] - start)
                    lengths.append(torch.bincount(rows[hit], minlength=batch).to(ln.dtype))
                totals[name] = ln
            else:
                values.append(v)
                lengths.append(ln)
        out = KeyedJaggedTensor(keys=self.table_keys, values=torch.cat(values), lengths=torch.cat(lengths))
        return out, totals

    def merge(
        self, pooled: Dict[str, torch.Tensor], totals: Dict[str, torch.Tensor]  # noqa: UP006
    ) -> Dict[str, torch.Tensor]:  # noqa: UP006
        out: Dict[str, torch.Tensor] = {}  # noqa: UP006
        for name in self.feature_names:
            if name in self.block_keys:
                width = self.widths[name]
                acc = torch.zeros(0)
                for i, k in enumerate(self.block_keys[name]):
                    p = pooled[k]
                    p = nn.functional.pad(p, [0, width - p.size(1)])
                    acc = p if i == 0 else acc + p
                if self.mean:
                    acc = acc / totals[name].clamp(min=1).to(acc.dtype).unsqueeze(1)
                out[name] = acc
            elif name in self.qr_combine:
                q = pooled[qr_key(name, "q")]
                r = pooled[qr_key(name, "r")]
                combine = self.qr_combine[name]
                out[name] = q + r if combine == 0 else (q * r if combine == 1 else torch.cat([q, r], dim=1))
            else:
                out[name] = pooled[name]
        return out

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        return self.split(kjt)[0]
