"""`salience bench compress`: a quick run on small synthetic data, every precision side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.benchmarks import compress


def test_quick_run_measures_every_precision_and_chooses_on_validation(tmp_path: Path) -> None:
    overrides = ["--override=--data.reader.init_args.n_rows=3000", "--override=--data.batch_size=256",
                 "--override=--model.backbone.init_args.deep_mlp=[16]"]
    committed = json.loads((compress.RESULTS / "compress.json").read_text())
    (tmp_path / "compress.json").write_text(json.dumps(committed))  # --merge keeps its datasets
    assert compress.main(["--datasets", "synthetic", "--seeds", "2", "--quick", *overrides, "--output-dir", str(tmp_path),
                          "--techniques", "fp32,fp16,int8,int4,half+int4,qr,hash+int8,budget", "--budget", "0.3",
                          "--merge"]) == 0
    result = json.loads((tmp_path / "compress.json").read_text())
    kept = set(committed["datasets"]) - {"synthetic"}
    assert set(result["datasets"]) == kept | {"synthetic"} and kept
    assert all(result["datasets"][k]["runs"] == committed["datasets"][k]["runs"] for k in kept)
    assert all(result["datasets"][k]["command"] for k in kept) and "kept with `--merge`" in (tmp_path / "compress.md").read_text()
    s = result["datasets"]["synthetic"]["summary"]
    assert [s[p]["bytes_ratio"] for p in compress.PRECISIONS][0] == 1.0
    ratios = [s[p]["bytes_ratio"] for p in compress.PRECISIONS]
    assert s["qr"]["bytes_ratio"] < 0.6 and s["hash+int8"]["bytes_ratio"] < s["qr"]["bytes_ratio"] / 2  # fewer rows, then int8
    assert s["half+int4"]["bytes_ratio"] < s["int4"]["bytes_ratio"]  # the halved dims at int4: fewer bytes than int4 alone
    rows = result["datasets"]["synthetic"]["runs"][0]["embedding_rows"]
    assert rows["qr"] and all(v["scheme"] == "qr" for v in rows["qr"].values()) and set(rows["hash"]) == set(rows["qr"])
    assert ratios == sorted(ratios, reverse=True) and ratios[1] == 0.5  # fp16 is half; int8, int4 smaller still
    assert s["fp32"]["test_auc_change"]["mean"] == 0.0 and s["int4"]["test_auc_change"]["mean"] != 0.0
    runs = result["datasets"]["synthetic"]["runs"]
    for r in runs:  # the budget search fits its plan under 0.3 x the uniform-16 fp32 bytes
        assert r["techniques"]["budget"]["embedding_bytes"] <= r["budget"]["budget_bytes"]
        assert r["budget"]["chosen_layout"] in r["fit_seconds"] and r["budget"]["validation_passes"] > 3
        # the importance layouts follow OutRank's ranking of the training split (every sparse feature in it)
        (importance,) = {"importance@int8", "importance@int4"} & set(r["fit_seconds"])  # one at 0.3x: widest dims at both
        assert set(r["embedding_dims"][importance]) <= set(r["importance_ranking"])
    assert all(set(r["techniques"]["int8"]["latency_ms"]) == {"1", "1024"} for r in runs)
    for r in runs:  # DeLong on the seed's test rows: every technique against fp32, the budget against each
        assert {"int8 - fp32", "budget - qr", "budget - fp32"} <= set(r["paired"])
        assert r["paired"]["int8 - fp32"]["method"] == "delong" and set(r["epochs_run"]) == set(r["fit_seconds"])
    assert s["int8"]["test_auc_change"]["method"] == "delong per seed, over seeds"
    assert len(s["chosen_on_validation"]["techniques"]) == 2
    assert "int8 within 0.0005 test AUC of fp32" in result["datasets"]["synthetic"]["verdicts"]
    assert (tmp_path / "compress.png").stat().st_size > 0 and "| synthetic | int8 |" in (tmp_path / "compress.md").read_text()


def test_within_reads_the_interval_over_seeds() -> None:
    steady, noisy = compress._summary([-0.0005, -0.0004, -0.0006]), compress._summary([-0.0005, 0.004, -0.006])
    assert compress.within(steady, 0.001) == "met"  # the whole interval above -0.001
    assert compress.within(noisy, 0.001).startswith("inconclusive")  # same mean, the seeds disagree
    gain = compress._summary([0.020, 0.021, 0.019])
    assert compress.within(gain, 0.001) == "met"  # a gain is within a loss tolerance
    assert compress.within(gain, 0.001, both_ways=True) == "NOT met"
    assert compress.within(compress._summary([-0.008, -0.0085, -0.0075]), 0.001) == "NOT met"
    assert compress.within(compress._summary([-0.0001]), 0.001).startswith("inconclusive")  # one seed: no interval


def test_changes_are_paired_on_the_test_rows_per_seed_and_combined() -> None:
    """With per-seed DeLong intervals a change is their combination over seeds (the rows' variance
    plus the seeds' spread), not the bare t over seeds; runs without them keep the t interval."""
    from recsys.stats import Interval, over_seeds

    per_seed = [Interval(-0.0004, -0.0014, 0.0006, se=0.0005, method="delong", n=8000),
                Interval(-0.0002, -0.0012, 0.0008, se=0.0005, method="delong", n=8000)]
    runs = [{"techniques": {"fp32": {"test": {"auc": 0.96}}, "int8": {"test": {"auc": 0.96 + d.estimate}}},
             "paired": {"int8 - fp32": d.to_dict()}} for d in per_seed]
    change = compress._paired(runs, "int8", "fp32")
    expected = over_seeds(per_seed)
    assert (change["mean"], change["low"], change["high"]) == pytest.approx((expected.estimate, expected.low, expected.high))
    assert change["method"] == "delong per seed, over seeds"
    assert compress._paired(runs, "fp32", "fp32")["high"] == 0.0
    bare = [{k: v for k, v in r.items() if k != "paired"} for r in runs]
    assert compress._paired(bare, "int8", "fp32")["low"] == pytest.approx(compress._summary([-0.0004, -0.0002])["low"])
    chosen = compress._chosen_change(runs, ["int8", "fp32"])  # fp32 chosen on a seed: a zero change on that seed
    assert chosen["mean"] == pytest.approx(-0.0002)


def test_latency_verdict_needs_the_interval() -> None:
    assert compress._latency_verdict(compress._summary([0.6, 0.62, 0.58])).startswith("met (x0.60 [")
    assert compress._latency_verdict(compress._summary([1.3, 1.32, 1.28])).startswith("NOT met")
    assert compress._latency_verdict(compress._summary([0.7, 1.4, 0.9])).startswith("inconclusive")
    assert compress._latency_verdict(compress._summary([0.5])).startswith("inconclusive (one seed")


def test_render_recomputes_the_verdicts_from_the_committed_measurements(tmp_path: Path) -> None:
    committed = json.loads((compress.RESULTS / "compress.json").read_text())
    for d in committed["datasets"].values():
        d["verdicts"] = {"stale": "yes"}
    (tmp_path / "compress.json").write_text(json.dumps(committed))
    assert compress.main(["--render", "--output-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "compress.json").read_text())
    for name, d in result["datasets"].items():
        assert d["verdicts"] == compress.verdicts(d["summary"], d["runs"]) and "stale" not in d["verdicts"]
        assert d["runs"] == committed["datasets"][name]["runs"]  # nothing measured again
    assert "Verdicts recomputed" in (tmp_path / "compress.md").read_text()
