"""Standalone loader of a Salience export: needs only torch, fbgemm_gpu and the standard library.

    import loader                                # this file, inside the export folder
    module, schema = loader.load("export_dir")  # TorchScript module + parsed schema.json
    loader.predict([{"user": "u7", "genres": "a|b", "age": 31}])  # -> [0.42]
    loader.scorer().oov_counts                   # unseen categories per feature (cumulative)

CLI: ``python loader.py DIR --records r.json`` prints scores as JSON; ``--inputs in.pt --outputs
out.pt`` runs the module on saved tensors. Encoding mirrors recsys.data.encoders: vocabulary id
(0 = OOV); hashed features ``1 + siphash24(token) % hash_size`` exactly as pandas.util.hash_array;
missing/NaN/inf dense values -> fill_value, then log1p(max(x, 0)) or (x - mean) / std.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

import fbgemm_gpu  # noqa: F401  (registers the fbgemm:: ops; must come before torch.jit.load)
import torch

HERE = Path(__file__).resolve().parent
_M = (1 << 64) - 1


def load(export_dir: str | Path = HERE) -> tuple[torch.jit.ScriptModule, dict[str, Any]]:
    """The scripted module (eval mode) and the parsed ``schema.json`` of ``export_dir``."""
    export_dir = Path(export_dir)
    schema = json.loads((export_dir / "schema.json").read_text(encoding="utf-8"))
    check_kernels(schema, export_dir)
    module = torch.jit.load(str(export_dir / "model.pt"), map_location="cpu")
    module.eval()
    return module, schema


def check_kernels(schema: dict[str, Any], export_dir: str | Path = HERE) -> None:
    """Refuse, with the reason, an export whose quantized tables this fbgemm_gpu cannot run."""
    tables = (schema.get("embedding_precision") or {}).get("tables") or {}
    low = sorted({p for p in tables.values() if p != "fp32"})
    if low and not hasattr(torch.ops.fbgemm, "int_nbit_split_embedding_codegen_lookup_function"):
        raise RuntimeError(
            f"{export_dir}: its embedding tables are stored as {', '.join(low)}, and this fbgemm_gpu "
            f"({getattr(fbgemm_gpu, '__version__', '?')}) lacks the quantized lookup op "
            "fbgemm::int_nbit_split_embedding_codegen_lookup_function; install an fbgemm_gpu build with the "
            "inference ops (the CPU and CUDA wheels of fbgemm-gpu have them), or export with --precision fp32"
        )


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M


def _rounds(v: list[int], n: int) -> None:
    for _ in range(n):
        v[0] = (v[0] + v[1]) & _M; v[1] = _rotl(v[1], 13) ^ v[0]; v[0] = _rotl(v[0], 32)  # noqa: E702
        v[2] = (v[2] + v[3]) & _M; v[3] = _rotl(v[3], 16) ^ v[2]  # noqa: E702
        v[0] = (v[0] + v[3]) & _M; v[3] = _rotl(v[3], 21) ^ v[0]  # noqa: E702
        v[2] = (v[2] + v[1]) & _M; v[1] = _rotl(v[1], 17) ^ v[2]; v[2] = _rotl(v[2], 32)  # noqa: E702


def hash_token(token: str, hash_size: int, key: str = "0123456789123456") -> int:
    """``1 + h % hash_size``, h = pandas.util.hash_array([token], categorize=False)[0]."""
    data = token.encode("utf8")
    k0, k1 = struct.unpack("<QQ", key.encode("utf8"))
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    end = len(data) - len(data) % 8
    words = [int.from_bytes(data[i : i + 8], "little") for i in range(0, end, 8)]
    words.append(((len(data) & 0xFF) << 56) | int.from_bytes(data[end:], "little"))
    for m in words:  # siphash-2-4
        v[3] ^= m
        _rounds(v, 2)
        v[0] ^= m
    v[2] ^= 0xFF
    _rounds(v, 4)
    h = v[0] ^ v[1] ^ v[2] ^ v[3]
    h ^= h >> 30; h = (h * 0xBF58476D1CE4E5B9) & _M; h ^= h >> 27  # noqa: E702  (pandas' mixer)
    h = (h * 0x94D049BB133111EB) & _M; h ^= h >> 31  # noqa: E702
    return 1 + h % hash_size


def _token(cell: Any, missing: Any) -> str:
    token = "" if cell is None or (isinstance(cell, float) and math.isnan(cell)) else str(cell)
    return "" if missing is not None and token == str(missing) else token


def _number(cell: Any, missing: Any) -> float:
    try:
        x = float(cell)
    except (TypeError, ValueError):
        return math.nan
    return math.nan if missing is not None and not isinstance(missing, str) and x == float(missing) else x


def _keys(f: dict[str, Any]) -> list[str]:  # a vector's D prefixed record keys
    return [(f.get("prefix") or f["name"] + "_") + str(k) for k in range(f.get("dim") or 0)]


def _cells(rec: dict[str, Any], f: dict[str, Any], i: int) -> list[Any]:
    """A dense feature's value, or a vector's D numbers (a list or None under its name, or its keys)."""
    if f["kind"] == "vector" and f["name"] not in rec:
        return [rec[k] for k in _keys(f)]
    cells = [rec[f["name"]]] if f["kind"] != "vector" else rec[f["name"]] or [None] * f["dim"]
    if len(cells) != (f.get("dim") or 1):
        raise ValueError(f"record {i}: vector feature {f['name']!r} needs {f['dim']} numbers, got {len(cells)}")
    return list(cells)


class Scorer:
    """Raw records -> click probabilities through one export; counts OOV ids and filled values."""

    def __init__(self, export_dir: str | Path = HERE) -> None:
        self.module, self.schema = load(export_dir)
        feats = self.schema["schema"]["features"]
        self.dense = [f for f in feats if f["kind"] in ("dense", "vector")]
        self.sparse = [f for f in feats if f not in self.dense]
        self.vocab = {n: {t: i + 1 for i, t in enumerate(ts)} for n, ts in self.schema["vocabularies"].items()}
        self.oov_counts = {f["name"]: 0 for f in self.sparse}
        self.dense_filled = {f["name"]: 0 for f in self.dense}

    def encode(self, records: list[dict[str, Any]]) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """(values per sparse feature: int64, lengths per sparse feature: int32 B, dense: B x D float32)."""
        feats = self.sparse + self.dense
        for i, rec in enumerate(records):
            lacking = [f["name"] for f in feats if f["name"] not in rec and not (_keys(f) and all(k in rec for k in _keys(f)))]
            if lacking:
                raise ValueError(f"record {i} lacks feature {lacking[0]!r}; available keys: {sorted(rec)}")
        values, lengths = [], []
        for f in self.sparse:
            ids: list[int] = []
            lens: list[int] = []
            for rec in records:
                tok = _token(rec[f["name"]], f["missing_value"])
                toks = [t for t in tok.split(f["separator"]) if t != ""] if f["kind"] == "multi_categorical" else [tok]
                if f["hash_size"] is not None:
                    ids.extend(hash_token(t, f["hash_size"]) for t in toks)
                else:
                    ids.extend(self.vocab[f["name"]].get(t, 0) for t in toks)
                lens.append(len(toks))
            self.oov_counts[f["name"]] += ids.count(0)
            values.append(torch.tensor(ids, dtype=torch.int64))
            lengths.append(torch.tensor(lens, dtype=torch.int32))
        cols = []
        for f in self.dense:
            mean, std = self.schema["dense_stats"][f["name"]]
            parts: list[list[float]] = [[] for _ in range(f.get("dim") or 1)]
            for i, rec in enumerate(records):
                for k, cell in enumerate(_cells(rec, f, i)):
                    x = _number(cell, f["missing_value"])
                    if not math.isfinite(x):
                        x, self.dense_filled[f["name"]] = float(f["fill_value"]), self.dense_filled[f["name"]] + 1
                    t = f["transform"]
                    parts[k].append(math.log1p(max(x, 0.0)) if t == "log1p" else (x - mean) / std if t == "standardize" else x)
            cols.extend(parts)
        dense = torch.tensor(cols, dtype=torch.float64).reshape(len(cols), len(records)).t().to(torch.float32)
        return values, lengths, dense.contiguous()

    def predict(self, records: list[dict[str, Any]]) -> list[float]:
        with torch.no_grad():
            return self.module(*self.encode(records)).tolist()


_SCORERS: dict[str, Scorer] = {}


def scorer(export_dir: str | Path = HERE) -> Scorer:
    """The cached :class:`Scorer` of ``export_dir`` (default: the folder of this file)."""
    key = str(Path(export_dir).resolve())
    if key not in _SCORERS:
        _SCORERS[key] = Scorer(key)
    return _SCORERS[key]


def predict(records: list[dict[str, Any]], export_dir: str | Path = HERE) -> list[float]:
    """Click probabilities of raw records (dicts keyed by feature name; extra keys ignored)."""
    return scorer(export_dir).predict(records)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("export_dir", nargs="?", default=str(HERE))
    p.add_argument("--records", help="JSON list of records: prints scores and counts as JSON")
    p.add_argument("--inputs", help="torch.save'd {'batches': [{'values', 'lengths', 'dense'}]}")
    p.add_argument("--outputs", help="where --inputs writes {'outputs': [B tensors], 'modules': [...]}")
    args = p.parse_args(argv)
    if args.records:
        s = scorer(args.export_dir)
        scores = s.predict(json.loads(Path(args.records).read_text(encoding="utf-8")))
        print(json.dumps({"scores": scores, "oov_counts": s.oov_counts, "dense_filled": s.dense_filled}))
    if args.inputs:
        module, _ = load(args.export_dir)
        batches = torch.load(args.inputs, weights_only=True)["batches"]
        with torch.no_grad():
            outs = [module(b["values"], b["lengths"], b["dense"]) for b in batches]
        heavy = sorted({m.split(".")[0] for m in sys.modules} & {"recsys", "torchrec", "pandas"})
        torch.save({"outputs": outs, "modules": heavy}, args.outputs)


if __name__ == "__main__":
    main()
