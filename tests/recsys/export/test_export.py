"""Export: scripted serving module, export directory, standalone loader, Predictor, parity.

Tolerance: exported and eager models run the same float32 CPU kernels on the same inputs
(the fused FBGEMM table is copied bit for bit into a plain EmbeddingBagCollection), so the
probabilities agree to 1e-6 absolute; the eager reference is computed in this process and the
exported module runs in a fresh interpreter that imports only torch + fbgemm_gpu.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.data.encoders import Preprocessor, hash_ids
from recsys.data.schema import FeatureSpec, Schema
from recsys.export import (
    EXPORT_FORMAT,
    MissingFeatureError,
    Predictor,
    ServingModule,
    check_parity,
    check_parity_in_fresh_process,
    export_model,
    save_parity_inputs,
    synthetic_inputs,
    to_plain_kernel,
)
from recsys.models.archs import DLRM, DCNv2, DeepFM
from recsys.models.base import RankingModel, SparseArchConfig

ATOL = 1e-6
BATCH_SIZES = (1, 7, 300)
MODELS: dict[str, Callable[[Schema, SparseArchConfig | None], RankingModel]] = {
    "dlrm": lambda s, k: DLRM(s, bottom_mlp=[16, 8], top_mlp=[16], sparse_arch=k),
    "dcnv2": lambda s, k: DCNv2(s, cross_layers=2, deep_mlp=[16], sparse_arch=k),
    "deepfm": lambda s, k: DeepFM(s, deep_mlp=[16], sparse_arch=k),
}
CASES = [(m, d) for m in MODELS for d in ("dense", "nodense")] + [("dlrm_fused", "dense")]


# -- tiny helpers ------------------------------------------------------------------------------
def make_schema() -> Schema:
    """Categoricals with mixed dims (one hashed), a multi-hot bag, dense with log1p/standardize.

    Dims are multiples of 4: the fused FBGEMM kernel refuses others.
    """
    return Schema(
        (
            FeatureSpec("user", embedding_dim=8),
            FeatureSpec("item", embedding_dim=4, min_count=2),
            FeatureSpec("site", embedding_dim=12, hash_size=17),
            FeatureSpec("genres", kind="multi_categorical", embedding_dim=4),
            FeatureSpec("clicks", kind="dense", transform="log1p", missing_value=-1.0, fill_value=0.5),
            FeatureSpec("age", kind="dense", transform="standardize"),
            FeatureSpec("score", kind="dense"),
        ),
        label="click",
    )


def make_frame(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    genres = [f"g{i}" for i in range(6)]
    return pd.DataFrame(
        {
            "user": [f"u{i}" for i in rng.integers(0, 25, n)],
            "item": [f"i{i}" for i in rng.integers(0, 40, n)],
            "site": rng.choice(["news", "sport", "météo", "blog"], n),
            "genres": ["|".join(rng.choice(genres, rng.integers(0, 4), replace=False)) for _ in range(n)],
            "clicks": rng.poisson(3.0, n).astype(float),
            "age": rng.normal(35, 9, n),
            "score": rng.normal(0, 1, n),
            "click": rng.integers(0, 2, n),
        }
    )


def make_model(name: str, schema: Schema, seed: int = 0) -> RankingModel:
    torch.manual_seed(seed)
    fused = name.endswith("_fused")
    model = MODELS[name.removesuffix("_fused")](schema, SparseArchConfig(kernel="fused") if fused else None)
    with torch.no_grad():  # spread the untrained outputs away from 0.5
        for p in model.parameters():
            p.mul_(1.5)
    if fused:  # one step of the optimizer fused into backward: the tables leave their init
        before = {k: v.clone() for k, v in model.sparse_arch.state_dict().items()}
        batch = random_batch(schema, 32, seed=7)
        model(batch.dense_features, batch.sparse_features).sum().backward()
        after = model.sparse_arch.state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before)
    return model


def random_batch(schema: Schema, batch_size: int, seed: int) -> Batch:
    """Random ids, multi-hot bags of 0..5 ids (export-time checks use at most 3, B in {1, 5})."""
    values, lengths, dense = synthetic_inputs(schema, batch_size, 5, seed=seed)
    kjt = KeyedJaggedTensor(keys=schema.sparse_names, values=torch.cat(values), lengths=torch.cat(lengths))
    return Batch(dense_features=dense, sparse_features=kjt, labels=torch.zeros(batch_size))


def raw_records() -> list[dict[str, Any]]:
    """Raw records with unseen categories, missing cells, NaN/inf/strings in dense, no label."""
    return [
        {"user": "u1", "item": "i3", "site": "news", "genres": "g1|g2", "clicks": 2, "age": 30.0, "score": 0.1},
        {"user": "zz-new", "item": "i-new", "site": "unseen-site", "genres": "g0|new|g5", "clicks": float("nan"),
         "age": float("inf"), "score": -0.3},
        {"user": None, "item": 7, "site": "météo", "genres": "", "clicks": -1.0, "age": "41.5", "score": "oops"},
        {"user": "u2", "item": "i1", "site": None, "genres": None, "clicks": None, "age": 50, "score": 2.5,
         "extra": "ignored"},
    ] * 3


# expected counts for raw_records(): OOV = unseen categories (and missing cells absent from the vocabulary)
def expected_counts(pre: Preprocessor, records: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
    oov = {f.name: 0 for f in pre.schema.sparse}
    for rec in records:
        for f in pre.schema.sparse:
            if f.hash_size is not None:
                continue
            cell = rec[f.name]
            token = "" if cell is None else str(cell)
            tokens = [t for t in token.split("|") if t] if f.name == "genres" else [token]
            oov[f.name] += sum(t not in pre.vocabularies[f.name].tokens for t in tokens)
    filled = {f.name: 0 for f in pre.schema.dense}
    for rec in records:
        for f in pre.schema.dense:
            try:
                x = float(rec[f.name])
            except (TypeError, ValueError):
                x = math.nan
            filled[f.name] += (not math.isfinite(x)) or (f.missing_value is not None and x == f.missing_value)
    return oov, filled


# runs in a fresh interpreter: imports each export's loader.py, runs saved inputs and raw records
FRESH_SCRIPT = r"""
import importlib.util, json, sys, torch
jobs = json.loads(sys.argv[1])
results = {}
for i, job in enumerate(jobs):
    spec = importlib.util.spec_from_file_location(f"loader_{i}", job["dir"] + "/loader.py")
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    module, schema = loader.load(job["dir"])
    saved = torch.load(job["inputs"], weights_only=True)
    with torch.no_grad():
        outs = [module(b["values"], b["lengths"], b["dense"]) for b in saved["batches"]]
    records = json.loads(open(job["records"]).read())
    scores = loader.predict(records, job["dir"])
    s = loader.scorer(job["dir"])
    results[job["dir"]] = {"outputs": outs, "scores": scores, "oov": s.oov_counts, "filled": s.dense_filled}
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"recsys", "torchrec", "pandas"})
torch.save({"results": results, "heavy": heavy}, sys.argv[2])
"""


@dataclass
class Exported:
    model: RankingModel
    pre: Preprocessor
    dir: Path
    inputs: Path
    batches: list[Batch]
    fresh: dict[str, Any]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Exported]:
    """Every case exported, then all loaders run in ONE fresh interpreter (keeps the test fast)."""
    root = tmp_path_factory.mktemp("export")
    frame = make_frame()
    records_file = root / "records.json"
    records_file.write_text(json.dumps(raw_records()))
    out: dict[tuple[str, str], Exported] = {}
    for name, variant in CASES:
        schema = make_schema()
        if variant == "nodense":
            schema = schema.drop(schema.dense_names)
        pre = Preprocessor(schema).fit(frame)
        model = make_model(name, pre.fitted_schema)
        out_dir = root / f"{name}-{variant}"
        export_model(model, pre, out_dir, metadata={"case": f"{name}-{variant}"})
        batches = [random_batch(pre.fitted_schema, b, seed=100 + b) for b in BATCH_SIZES]
        inputs = save_parity_inputs(root / f"{name}-{variant}.pt", model, batches)
        out[(name, variant)] = Exported(model, pre, out_dir, inputs, batches, {})
    jobs = [{"dir": str(e.dir), "inputs": str(e.inputs), "records": str(records_file)} for e in out.values()]
    result_file = root / "fresh.pt"
    proc = subprocess.run(
        [sys.executable, "-c", FRESH_SCRIPT, json.dumps(jobs), str(result_file)],
        cwd=root, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    fresh = torch.load(result_file, weights_only=True)
    assert fresh["heavy"] == [], f"the standalone loader imported {fresh['heavy']}"
    for e in out.values():
        e.fresh = fresh["results"][str(e.dir)]
    return out


# -- tests -----------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["dense", "nodense"])
def test_script_shapes(variant: str) -> None:
    """Golden shape check: the scripted ServingModule returns B probabilities for any B and bags."""
    schema = make_schema()
    if variant == "nodense":
        schema = schema.drop(schema.dense_names)
    fitted = Preprocessor(schema).fit(make_frame(60)).fitted_schema
    scripted = torch.jit.script(ServingModule(make_model("dlrm", fitted).eval()))
    for b in BATCH_SIZES:
        values, lengths, dense = synthetic_inputs(fitted, b, 5, seed=b)
        probs = scripted(values, lengths, dense)
        assert probs.shape == (b,) and probs.dtype == torch.float32
        assert bool(((probs >= 0) & (probs <= 1)).all())
        # int64 lengths are accepted and give the same result
        assert torch.equal(scripted(values, [ln.long() for ln in lengths], dense), probs)
    with pytest.raises(Exception, match="sum\\(lengths\\)"):
        scripted(values, [ln + 1 for ln in lengths], dense)
    with pytest.raises(Exception, match="dense must be B x"):
        scripted(values, lengths, torch.zeros(b, 5))


@pytest.mark.parametrize(("name", "variant"), CASES)
def test_fresh_process_parity(exported: dict[tuple[str, str], Exported], name: str, variant: str) -> None:
    """loader.py in a fresh interpreter == eager, for B in (1, 7, 300) and bags of 0..5 ids."""
    e = exported[(name, variant)]
    saved = torch.load(e.inputs, weights_only=True)
    for b, out, ref in zip(BATCH_SIZES, e.fresh["outputs"], saved["expected"], strict=True):
        assert out.shape == ref.shape == (b,)
        assert float((out - ref).abs().max()) <= ATOL
    assert check_parity(e.dir, e.model, e.batches) <= ATOL
    lens = [int(x) for x in saved["batches"][2]["lengths"][saved["feature_names"].index("genres")]]
    assert max(lens) == 5 and min(lens) == 0


@pytest.mark.parametrize(("name", "variant"), CASES)
def test_records_parity(exported: dict[tuple[str, str], Exported], name: str, variant: str) -> None:
    """loader.predict == Predictor.load().predict == eager on raw records, with the same counts."""
    e = exported[(name, variant)]
    records = raw_records()
    pred = Predictor.load(e.dir)
    scores = pred.predict(records)
    eager = Predictor.from_model(e.model, e.pre).predict(records)
    np.testing.assert_allclose(scores, eager, rtol=0, atol=ATOL)
    np.testing.assert_allclose(np.asarray(e.fresh["scores"]), scores, rtol=0, atol=ATOL)
    oov, filled = expected_counts(e.pre, records)
    assert pred.oov_counts == e.fresh["oov"] == {**oov, "site": 0}
    assert pred.dense_filled == e.fresh["filled"] == filled
    assert oov["user"] == 6 and oov["item"] == 6 and oov["genres"] == 3
    if variant == "dense":
        assert filled == {"clicks": 9, "age": 3, "score": 3}
    # a DataFrame without label column gives the same scores
    frame = pd.DataFrame(records)[e.pre.schema.names].astype(object)
    np.testing.assert_allclose(pred.predict(frame), scores, atol=ATOL)


def test_fused_export(exported: dict[tuple[str, str], Exported], tmp_path: Path) -> None:
    """A fused-kernel model exports on a plain-kernel copy and matches in a fresh process."""
    e = exported[("dlrm_fused", "dense")]
    assert e.model.sparse_arch.is_fused
    plain = to_plain_kernel(e.model)
    assert not plain.sparse_arch.is_fused and plain is not e.model
    for key, value in e.model.state_dict().items():
        assert torch.equal(value, plain.state_dict()[key]), key
    info = json.loads((e.dir / "schema.json").read_text())
    assert info["trained_kernel"] == "fused"
    assert check_parity_in_fresh_process(e.dir, e.inputs) <= ATOL  # the public fresh-process API
    assert check_parity_in_fresh_process(e.dir, e.model, e.batches[:2]) <= ATOL  # (model, batches) form
    # the loader's command line on raw records
    (tmp_path / "r.json").write_text(json.dumps(raw_records()[:4]))
    cmd = [sys.executable, str(e.dir / "loader.py"), str(e.dir), "--records", str(tmp_path / "r.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected = Predictor.load(e.dir).predict(raw_records()[:4])
    np.testing.assert_allclose(json.loads(proc.stdout)["scores"], expected, atol=ATOL)


def test_missing_feature_is_a_clear_error(exported: dict[tuple[str, str], Exported]) -> None:
    e = exported[("deepfm", "dense")]
    record = {k: v for k, v in raw_records()[0].items() if k != "age"}
    with pytest.raises(MissingFeatureError, match=r"record 1 lacks feature 'age'.*available keys: \['clicks'"):
        Predictor.load(e.dir).predict([raw_records()[0], record])
    with pytest.raises(MissingFeatureError, match="lack feature 'age'.*available columns"):
        Predictor.load(e.dir).predict(pd.DataFrame([record]))
    import importlib.util

    spec = importlib.util.spec_from_file_location("salience_loader_test", e.dir / "loader.py")
    assert spec is not None and spec.loader is not None
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    with pytest.raises(ValueError, match=r"record 0 lacks feature 'age'; available keys"):
        loader.predict([record], e.dir)
    # the hashing of the loader is pandas' hash_array, bit for bit
    tokens = ["", "a", "news", "météo", "exactly8", "nine char", "x" * 16, "unicode ✓ ü 日本", "0"]
    for size in (17, 2**61 - 1):
        assert [loader.hash_token(t, size) for t in tokens] == hash_ids(np.array(tokens, dtype=object), size).tolist()


def test_export_directory(exported: dict[tuple[str, str], Exported]) -> None:
    """schema.json content, embedded copy in model.pt, and an atomic, careful overwrite."""
    e = exported[("dcnv2", "dense")]
    info = json.loads((e.dir / "schema.json").read_text())
    assert info["format"] == EXPORT_FORMAT and info["label"] == "click"
    assert info["sparse_features"] == ["user", "item", "site", "genres"]
    assert info["dense_features"] == ["clicks", "age", "score"]
    assert info["vocabularies"]["user"] == e.pre.vocabularies["user"].tokens
    assert "site" not in info["vocabularies"] and info["hashing"]["site"]["hash_size"] == 17
    assert info["dense_stats"]["age"] == list(e.pre.dense_stats["age"])
    feats = info["schema"]["features"]
    dims = {f["name"]: (f["embedding_dim"], f["num_embeddings"]) for f in feats if f["kind"] != "dense"}
    assert dims["user"] == (8, len(e.pre.vocabularies["user"]) + 1) and dims["site"] == (12, 18)
    assert info["metadata"] == {"case": "dcnv2-dense"} and info["salience_version"]
    extra = {"schema.json": ""}
    torch.jit.load(str(e.dir / "model.pt"), _extra_files=extra)
    assert json.loads(extra["schema.json"]) == info
    # a small plain-PyTorch file a reader can audit: ids, bags, hashing, scalars and vectors
    assert len((e.dir / "loader.py").read_text().splitlines()) < 210

    # re-export over a previous export works and leaves no temp folders; a foreign folder is refused
    model = e.model.train()
    result = export_model(model, e.pre, e.dir, metadata={"again": True})
    assert model.training and all(m.training for m in model.modules())
    assert json.loads(result.schema_path.read_text())["metadata"] == {"again": True}
    assert result.max_abs_diff <= ATOL and not result.converted_from_fused
    assert not [p for p in e.dir.parent.iterdir() if p.name.startswith(".")]
    foreign = e.dir.parent / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        export_model(model, e.pre, foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_the_header_reader_stops_before_the_vocabularies(exported: dict[tuple[str, str], Exported], tmp_path: Path) -> None:
    from recsys.export import load_exported, read_export_header, read_export_schema

    e = exported[("dcnv2", "dense")]
    full = read_export_schema(e.dir)
    assert list(full)[-1] == "vocabularies"  # written last
    header = read_export_header(e.dir)
    assert header == {k: v for k, v in full.items() if k != "vocabularies"}
    # it never parses the tokens: a vocabulary section that is not JSON at all still gives the header
    broken = tmp_path / "broken"
    shutil.copytree(e.dir, broken)
    text = (broken / "schema.json").read_text()
    at = text.index('\n "vocabularies": ')
    (broken / "schema.json").write_text(text[:at] + '\n "vocabularies": {"user": [not json')
    assert read_export_header(broken) == header
    assert load_exported(broken) is not None  # the kernel check reads the header only
    # an older export (vocabularies right after the schema, before the stats and precisions) is
    # parsed whole, to the same header
    old = tmp_path / "old"
    shutil.copytree(e.dir, old)
    keys = [k for k in full if k != "vocabularies"]
    at = keys.index("schema") + 1
    reordered = {k: full[k] for k in [*keys[:at], "vocabularies", *keys[at:]]}
    (old / "schema.json").write_text(json.dumps(reordered, indent=1))
    assert read_export_header(old) == header
    with pytest.raises(FileNotFoundError, match="not an export directory"):
        read_export_header(tmp_path)
