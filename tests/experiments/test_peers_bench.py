"""`experiments/benchmarks/peers.py`: the Frappe split, the report and its verdicts, the arguments
(no FuxiCTR install, no network)."""

from __future__ import annotations

import csv
import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from experiments.benchmarks import peers
from tests.conftest import require_dataset

FIELDS = ["a", "b", "c"]


def _write_libfm(path: Path, lines: list[str], newline: str) -> None:
    with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
        f.write("".join(line + newline for line in lines))


def _read_csv(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


@pytest.fixture
def tiny_source(tmp_path: Path) -> Path:
    """Two libFM files: the first with CRLF line ends and -1/1 labels, the second with LF and 0/1."""
    src = tmp_path / "frappe"
    src.mkdir()
    first = [f"{'1' if i % 3 == 0 else '-1'} {i}:1 {100 + i % 4}:1 {200 + i % 2}:1" for i in range(13)]
    second = [f"{i % 2} {50 + i}:1 {100 + i % 4}:1 {201}:1" for i in range(7)]
    _write_libfm(src / peers.SOURCE_FILES[0], first, "\r\n")
    _write_libfm(src / peers.SOURCE_FILES[1], second, "\n")
    return src


def test_split_keeps_tokens_as_categories_in_the_seeded_order(tiny_source: Path, tmp_path: Path) -> None:
    manifest = peers.build_split(tiny_source, tmp_path / "out", fields=FIELDS)
    n = 20
    assert manifest["source_rows"] == n
    assert manifest["rows"] == {"train": int(0.8 * n), "valid": int(0.1 * n), "test": n - int(0.8 * n) - int(0.1 * n)}
    labels, rows = peers.read_libfm(tiny_source / peers.SOURCE_FILES[0])
    more_labels, more_rows = peers.read_libfm(tiny_source / peers.SOURCE_FILES[1])
    labels, rows = labels + more_labels, rows + more_rows
    assert set(labels) == {0, 1} and labels[1] == 0  # -1 -> 0
    assert rows[0] == ["0", "100", "200"] and all("\r" not in c for r in rows for c in r)  # CRLF stripped
    order = peers.split_indices(n, peers.SPLIT_SEED)
    for part in peers.SPLIT_NAMES:
        table = _read_csv(tmp_path / "out" / f"{part}.csv")
        assert table[0] == ["label", *FIELDS]
        assert table[1:] == [[str(labels[i]), *rows[i]] for i in order[part]]
    schema = yaml.safe_load((tmp_path / "out" / "schema.yaml").read_text())
    assert [f["name"] for f in schema["features"]] == FIELDS and schema["label"] == "label"
    assert {f["embedding_dim"] for f in schema["features"]} == {10}


def test_split_is_deterministic_and_a_limit_subsamples(tiny_source: Path, tmp_path: Path) -> None:
    peers.build_split(tiny_source, tmp_path / "x", fields=FIELDS)
    peers.build_split(tiny_source, tmp_path / "y", fields=FIELDS)
    for part in peers.SPLIT_NAMES:
        assert (tmp_path / "x" / f"{part}.csv").read_bytes() == (tmp_path / "y" / f"{part}.csv").read_bytes()
    assert peers.split_indices(10, 1) != peers.split_indices(10, 2)
    small = peers.build_split(tiny_source, tmp_path / "z", fields=FIELDS, limit=10)
    assert small["rows"] == {"train": 8, "valid": 1, "test": 1}
    full_rows = {tuple(r) for p in peers.SPLIT_NAMES for r in _read_csv(tmp_path / "x" / f"{p}.csv")[1:]}
    assert {tuple(r) for p in peers.SPLIT_NAMES for r in _read_csv(tmp_path / "z" / f"{p}.csv")[1:]} <= full_rows


def test_split_rejects_bad_labels_and_ragged_rows(tmp_path: Path) -> None:
    _write_libfm(tmp_path / "bad.gz", ["2 1:1 2:1"], "\n")
    with pytest.raises(ValueError, match="label '2'"):
        peers.read_libfm(tmp_path / "bad.gz")
    _write_libfm(tmp_path / "ragged.gz", ["1 1:1 2:1", "0 1:1"], "\n")
    with pytest.raises(ValueError, match="ragged.gz:2"):
        peers.read_libfm(tmp_path / "ragged.gz")


def test_split_of_the_real_frappe_files(data_dir: Path, tmp_path: Path) -> None:
    """Fails (does not skip) when SALIENCE_DATA_DIR is set and the Frappe files are missing."""
    manifest = peers.build_split(require_dataset(data_dir, "frappe"), tmp_path)
    assert manifest["source_rows"] == 86_582
    assert manifest["rows"] == {"train": 69_265, "valid": 8_658, "test": 8_659}
    header = _read_csv(tmp_path / "test.csv")[0]
    assert header == ["label", "user", "item", "daytime", "weekday", "isweekend", "homework", "cost", "weather",
                      "country", "city"]


def _fake_runs(tmp_path: Path, labels: np.ndarray, lib: str, model: str, quality: float,
               wall: float) -> list[dict[str, Any]]:
    rng = np.random.default_rng(zlib.crc32(f"{lib}/{model}".encode()))
    runs = []
    for seed in range(3):
        scores = np.clip(labels * quality + rng.normal(0.0, 0.3, labels.size) + 0.5 * (1 - quality), 0.001, 0.999)
        path = tmp_path / f"{lib}-{model}-{seed}.npy"
        np.save(path, scores)
        runs.append({"library": lib, "model": model, "seed": seed, "test_auc": 0.9 + quality / 20 + seed * 1e-4,
                     "test_logloss": 0.2, "best_val_auc": 0.95, "wall_seconds": wall + seed, "samples_per_second": 1e4,
                     "peak_rss_mb": 900.0, "epochs": 12, "pred": str(path),
                     **({"versions": {"fuxictr": "2.3.10"}} if lib == "fuxictr" else {})})
    return runs


def test_report_pairs_the_arms_and_says_met_or_not(tmp_path: Path) -> None:
    labels = np.random.default_rng(0).integers(0, 2, 2000)
    runs = {
        "ours/dcnv2": _fake_runs(tmp_path, labels, "ours", "dcnv2", 0.9, 60.0),
        "fuxictr/dcnv2": _fake_runs(tmp_path, labels, "fuxictr", "dcnv2", 0.3, 120.0),
        "ours/deepfm": _fake_runs(tmp_path, labels, "ours", "deepfm", 0.3, 60.0),
        "fuxictr/deepfm": _fake_runs(tmp_path, labels, "fuxictr", "deepfm", 0.9, 50.0),
    }
    summary = {arm: peers.summarize(rs) for arm, rs in runs.items()}
    assert summary["ours/dcnv2"]["wall_seconds"] == pytest.approx({"mean": 61.0, "sd": 1.0, "se": 1 / 3**0.5, "n": 3})
    comparison = {m: peers.paired(runs[f"ours/{m}"], runs[f"fuxictr/{m}"], labels) for m in peers.MODELS}
    assert comparison["dcnv2"]["verdict"] == "better" and comparison["deepfm"]["verdict"] == "worse"
    assert len(comparison["dcnv2"]["per_seed"]) == 3 and comparison["dcnv2"]["combined"]["method"] == "seeds"
    verdicts = peers.target_verdicts(summary, comparison)
    dcnv2, deepfm, overall = verdicts.values()
    assert dcnv2.startswith("met: paired +") and "x0.50" in dcnv2 and "(better; means" in dcnv2
    assert deepfm.startswith("NOT met: paired -") and "(worse; means" in deepfm and "wall time more" in deepfm
    assert overall.startswith("NOT met")
    # a mean above with an interval across zero is a tie, not "met"
    tied = {**comparison["dcnv2"], "verdict": "tie"}
    verdict_tie, overall_tie = peers.target_verdicts(summary, {"dcnv2": tied}).values()
    assert verdict_tie.startswith("tie: paired") and overall_tie.startswith("tie")
    result = {"command": "python -m experiments.benchmarks.peers ", "date": "2026-01-01",
              "hardware": {"cpu": "cpu", "cores": 2, "gpu": None}, "seeds": 3, "quick": False, "note": "a note",
              "threads": 1, "stopped_by_budget": "seeds: 3 of 4 requested",
              "load_average": {"start": 1.0, "end": 2.0}, "total_seconds": 600.0,
              "split": {"source_rows": 20, "seed": 2026, "rows": {"train": 16, "valid": 2, "test": 2}},
              "summary": summary, "comparison": comparison, "verdicts": verdicts, "runs": runs,
              "versions": {"torch": "2.13.0"}}
    md = peers.to_markdown(result)
    assert "Command: `python -m experiments.benchmarks.peers`" in md and "Note: a note" in md
    assert "**Fewer seeds than requested** (seeds: 3 of 4 requested)" in md and "torch threads per fit: 1" in md
    assert "| ours/dcnv2 | 0.9451 ± 0.0001 |" in md and "| fuxictr/deepfm |" in md
    assert "| dcnv2 | over seeds |" in md and "**better**" in md and "**worse**" in md
    assert "| dcnv2 | 0 | +" in md and "peer fuxictr 2.3.10" in md and "--quick" not in md
    assert "/work/" not in md and str(tmp_path) not in md  # no machine paths in the report
    result["verdicts"] = {"stale": "yes"}
    (tmp_path / "peers.json").write_text(json.dumps(result))
    assert peers.main(["--render", "--output-dir", str(tmp_path)]) == 0
    rendered = (tmp_path / "peers.md").read_text()
    assert "stale" not in rendered and "| dcnv2: test AUC at or above FuxiCTR" in rendered
    assert "recomputed from these measurements by `python -m experiments.benchmarks.peers --render" in rendered


def test_quick_and_model_arguments() -> None:
    args = peers.parse_args(["--quick", "--seeds", "1", "--models", "deepfm"])
    assert args.quick and args.seeds == 1 and args.model_list == ["deepfm"]
    default = peers.parse_args([])
    assert not default.quick and default.seeds == 3 and default.model_list == ["dcnv2", "deepfm"]
    with pytest.raises(SystemExit):
        peers.parse_args(["--models", "dlrm"])
    with pytest.raises(SystemExit):
        peers.parse_args(["--seeds", "0"])
    assert default.threads == 1 and default.budget_minutes == 75.0


def test_the_budget_stops_seeds_only_after_the_second() -> None:
    assert peers.another_seed_fits([], 10_000.0, 75) and peers.another_seed_fits([3000.0], 10_000.0, 75)
    assert peers.another_seed_fits([1200.0, 1400.0], 2600.0, 75)  # 2600 + 1300 s <= 4500 s
    assert not peers.another_seed_fits([1200.0, 1400.0], 3300.0, 75)
    assert peers.another_seed_fits([1200.0, 1400.0], 1e9, 0)  # no budget


def test_peer_venv_is_made_only_when_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    ready = iter([False, True])
    monkeypatch.setattr(peers, "_peer_ready", lambda python: next(ready))
    monkeypatch.setattr(peers.subprocess, "run", lambda cmd, check: calls.append(list(cmd)))
    python = peers.ensure_peer_venv(tmp_path / "venv")
    assert python == tmp_path / "venv" / "bin" / "python"
    assert calls[0][1:] == ["-m", "venv", str(tmp_path / "venv")]
    assert calls[1][-1] == "torch==2.13.0" and calls[2][-2:] == ["fuxictr==2.3.10", "polars<2"]
    calls.clear()
    monkeypatch.setattr(peers, "_peer_ready", lambda python: True)
    assert peers.ensure_peer_venv(tmp_path / "venv") == python and calls == []


def test_our_configs_carry_the_peer_settings(tmp_path: Path) -> None:
    for model, settings in peers.PEER_SETTINGS.items():
        config = yaml.safe_load((peers.ROOT / peers.CONFIGS[model]).read_text())
        m, d = config["model"], config["data"]
        backbone = m["backbone"]["init_args"]
        assert d["batch_size"] == settings["batch_size"] and d["embedding_dim"] == settings["embedding_dim"]
        assert m["optimizer"]["init_args"] == {"lr": settings["learning_rate"], "weight_decay": settings["net_regularizer"]}
        assert m["embedding_weight_decay"] == settings["embedding_regularizer"] and m["embedding_kernel"] == "plain"
        assert m["early_stopping_patience"] == settings["early_stop_patience"]
        assert backbone["deep_mlp"] == settings["hidden_units"] and backbone["batch_norm"] == settings["batch_norm"]
        assert backbone["dropout"] == settings["net_dropout"] and config["trainer"]["max_epochs"] == settings["epochs"]
        if model == "dcnv2":
            assert backbone["cross_layers"] == settings["num_cross_layers"] and backbone["structure"] == "parallel"
    overrides = peers.fit_overrides(tmp_path)
    assert any(o.startswith("--data.split.files=") and str(tmp_path / "test.csv") in o for o in overrides)
    assert "--data.cache_dir=null" in overrides
