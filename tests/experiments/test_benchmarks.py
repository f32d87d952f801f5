"""Smoke tests of the committed benchmarks: they run end to end at tiny sizes, so they cannot rot.

The numbers of a ``--quick`` run are meaningless; only the output layout is checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments.benchmarks import train_throughput


def test_train_throughput_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SALIENCE_DATA_DIR", raising=False)  # the real-file stage is optional
    threads = torch.get_num_threads()
    assert train_throughput.main(["--quick", "--threads", "1", "--output-dir", str(tmp_path)]) == 0
    assert torch.get_num_threads() == threads  # restored for the rest of the session

    result = json.loads((tmp_path / "train_throughput.json").read_text())
    assert {"benchmark", "date", "command", "seeds", "config", "environment", "training", "pipeline"} <= set(result)
    assert {"cpu_model", "cpu_count", "torch", "torchrec", "fbgemm_gpu", "torch_threads"} <= set(result["environment"])
    assert result["environment"]["torch_threads"] == 1
    assert "--quick" in result["command"]

    training = result["training"]
    for part in ("full", "sparse_only"):
        block = training[part]
        assert set(block["summary"]) == {"plain", "fused"}
        for name in ("plain", "fused"):
            rates = block["samples_per_s"][name]
            assert len(rates) == result["config"]["repeats"] and all(r > 0 for r in rates)
            assert {"median", "min", "max", "iqr", "rel_spread"} <= set(block["summary"][name])
        assert block["ratio_fused_over_plain"]["of_medians"] > 0
        assert block["ratio_fused_over_plain"]["of_best"] > 0
        assert block["faster"] in ("plain", "fused")

    pipeline = result["pipeline"]
    assert "skipped" in pipeline["criteo_head10k"]
    synthetic = pipeline["synthetic_tsv"]
    assert synthetic["rows"] == result["config"]["synthetic_rows"]
    assert set(synthetic["rows_per_s"]) == {"read", "fit", "transform", "batches", "end_to_end"}

    markdown = (tmp_path / "train_throughput.md").read_text()
    assert "| plain |" in markdown and "| fused |" in markdown and "synthetic_tsv" in markdown


def test_train_throughput_reads_the_real_criteo_head(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``$SALIENCE_DATA_DIR`` the pipeline stage also runs on the real 10k-row head."""
    from tests.conftest import require_dataset

    require_dataset(data_dir, "criteo-kaggle-head10k")
    cfg = train_throughput.BenchConfig.quick()
    out = train_throughput.bench_pipeline(train_throughput.REAL_CRITEO, cfg.real_rows, cfg)
    assert out["rows"] == cfg.real_rows
    assert all(out["rows_per_s"][k]["median"] > 0 for k in ("read", "fit", "transform", "batches", "end_to_end"))


def test_selection_benchmark_quick(tmp_path: Path, data_dir: Path) -> None:
    """The selection benchmark runs end to end at tiny size (numbers meaningless); four methods of
    the registry's kinds (the contract test runs every one)."""
    from experiments.benchmarks import selection as bench
    from tests.conftest import require_dataset

    require_dataset(data_dir, "criteo-kaggle-head10k")
    methods = ["outrank", "leap", "lasso", "sfs"]
    assert bench.main(["--quick", "--methods", ",".join(methods), "--output-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "selection_quick.json").read_text())
    assert result["quick"] and set(result["synthetic"]["methods"]) == set(methods) and result["methods"] == methods
    for m in result["synthetic"]["methods"].values():
        assert 0.0 <= m["precision_at_10"]["mean"] <= 1.0 and len(m["runs"][0]["top10"]) == 10
    assert set(result["trap"]["methods"]) == set(methods)
    assert all(result[part]["hardware"] == result["hardware"] for part in ("synthetic", "trap", "cost"))  # each part names its machine
    assert set(result["curves"]) == set(bench.QUICK_CURVES)  # --quick: the Criteo head's curves only
    for dataset in bench.QUICK_CURVES:
        curves = result["curves"][dataset]["methods"]
        assert set(curves) == set(methods) and all(0.0 < m["test_aukc"]["mean"] < 1.0 for m in curves.values())
        assert all(m["rank_cost_fits"]["mean"] >= 0 for m in curves.values())
        # paired on the same test rows, per ranking seed: against the random rankings and against LeAP
        assert all(len(m["test_aukc_vs_random"]) == 1 and m["test_aukc_vs_random"][0]["method"] == "delong"
                   for m in curves.values())
        assert curves["leap"]["test_aukc_vs_leap"] is None and curves["lasso"]["test_aukc_vs_leap"][0]["n"] > 0
        assert result["curves"][dataset]["epochs"]["cap"] == 1  # --quick trains one epoch per fit
        assert (tmp_path / f"selection_quick_{dataset}.png").exists()
    assert set(result["leap_verdicts"]) == set(bench.QUICK_CURVES)
    cost = result["cost"]
    assert cost["leap_seconds"] > 0 and cost["permutation_val"]["total_seconds"] > 0
    markdown = (tmp_path / "selection_quick.md").read_text()
    assert "| plain training run |" in markdown and "## ID-like trap" in markdown and "| lasso |" in markdown
    assert bench.method_list() == [n for n in bench.method_list() if n != "random"] and "random" not in bench.method_list()
    # --merge keeps the parts a later run does not redo, each with the command that measured it
    assert bench.main(["--quick", "--merge", "--parts", "none", "--methods", ",".join(methods),
                       "--output-dir", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "selection_quick.json").read_text())
    assert merged["synthetic"] == result["synthetic"] | {"command": result["command"]} and merged["cost"]["leap_seconds"] > 0
    assert merged["earlier_commands"] == [result["command"]] and merged["complete"]
    # a part redone for some methods keeps the other methods' rows, naming the command of each
    assert bench.main(["--quick", "--merge", "--parts", "trap", "--methods", "lasso", "--output-dir", str(tmp_path)]) == 0
    redone = json.loads((tmp_path / "selection_quick.json").read_text())["trap"]
    assert set(redone["methods"]) == set(methods) and redone["measured_by"] == {m: result["command"] for m in methods if m != "lasso"}
    assert "; rows of leap, outrank, sfs by" in (tmp_path / "selection_quick.md").read_text()
    # so does a curve: with --random-seeds 0 its random rankings too; its plot stays the earlier run's
    plot = tmp_path / f"selection_quick_{bench.QUICK_CURVES[0]}.png"
    before = plot.read_bytes()
    earlier = json.loads((tmp_path / "selection_quick.json").read_text())["curves"][bench.QUICK_CURVES[0]]
    assert bench.main(["--quick", "--merge", "--parts", "curves", "--methods", "sfs", "--random-seeds", "0",
                       "--output-dir", str(tmp_path)]) == 0
    curve = json.loads((tmp_path / "selection_quick.json").read_text())["curves"][bench.QUICK_CURVES[0]]
    assert set(curve["methods"]) == set(earlier["methods"]) and curve["random"] == earlier["random"]
    assert {m: curve["methods"][m] for m in methods if m != "sfs"} == {m: earlier["methods"][m] for m in methods if m != "sfs"}
    assert set(curve["measured_by"]) == set(earlier["methods"]) - {"sfs"} and curve["plot_command"] == earlier["command"]
    assert curve["methods"]["sfs"]["test_aukc_vs_leap"] is None  # no LeAP curve in this run to pair with
    assert plot.read_bytes() == before and "The plot shows the curves of" in (tmp_path / "selection_quick.md").read_text()
    # the planted truth at a second size is a part of its own; the first-size table stays
    assert bench.main(["--quick", "--merge", "--parts", "synthetic_large", "--methods", "outrank",
                       "--output-dir", str(tmp_path)]) == 0
    large = json.loads((tmp_path / "selection_quick.json").read_text())
    assert set(large["synthetic_large"]["methods"]) == {"outrank"} and large["synthetic"] == merged["synthetic"]
    assert large["synthetic_large"]["rows"] == 2 * large["synthetic"]["rows"]
    screening = large["synthetic_large"]["methods"]["outrank"]["runs"][0]["screening"]  # OutRank's noise gate
    assert screening["pair"] == [] and screening["noise_fields"] == 28 and screening["pair_kept"]  # no pair in this layout
    assert "Screening (outrank's noise gate" in (tmp_path / "selection_quick.md").read_text()
    assert f"## Planted truth (synthetic, {large['synthetic_large']['rows']:,} rows" in (tmp_path / "selection_quick.md").read_text()
    bench.check_mergeable(bench.QUICK_CURVES[0], curve, 1, quick=True)
    with pytest.raises(SystemExit, match="rerun every method"):  # another seed count: refused before any fit
        bench.check_mergeable(bench.QUICK_CURVES[0], curve, 2, quick=True)


def test_selection_ablations_do_not_repeat_leaps_default_fusion() -> None:
    """The fusion ablation rows re-rank LeAP's fit under every other fusion; the one LeAP's
    ``auto`` resolves to at the recipe's width is ``leap`` itself, so it gets no row of its own."""
    from experiments.benchmarks import selection as bench
    from selection import LeAP, LeAPFusion

    for fields, default in ((10, LeAPFusion.RELEVANCE_HELDOUT), (100, LeAPFusion.SUM)):
        methods: dict[str, object] = {"leap": LeAP(seed=0, tracking=False)}
        bench._leap_ablations(methods, seed=0, quick=False, fields=fields)
        fusions = {n.removeprefix("leap[fusion=").rstrip("]") for n in methods if n.startswith("leap[fusion=")}
        assert fusions == {f.value for f in LeAPFusion} - {"auto", default.value}
        assert bench._default_fusion_row(fields) == f"leap[fusion={default.value}]"
        assert "leap[copies=off]" in methods


def test_dims_benchmark_quick(tmp_path: Path, data_dir: Path) -> None:
    """The embedding-dims benchmark runs end to end at tiny size (numbers meaningless)."""
    from experiments.benchmarks import dims as bench
    from tests.conftest import require_dataset

    require_dataset(data_dir, "criteo-kaggle-head10k")
    assert bench.main(["--quick", "--output-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "dims_quick.json").read_text())
    assert result["quick"] and set(result["runs"]) == set(bench.QUICK["runs"])
    assert {"command", "date", "hardware", "versions", "targets", "overall", "seconds"} <= set(result)
    for run in result["runs"].values():
        summary = run["summary"]
        assert set(summary) == set(bench.METHODS)
        assert summary["uniform-16"]["parameter_ratio"] == pytest.approx(1.0)
        for method in ("mde", "dnis", "ihas"):  # matched budgets: half of uniform-16 at most
            assert summary[method]["embedding_parameters_mean"] <= run["budget"]
            assert 0.0 < summary[method]["test_auc_mean"] < 1.0
        for method in ("dnis", "ihas"):
            assert summary[method]["search_vs_plain_run_mean"] > 0
        assert set(run["verdicts"]) >= {"dnis_matches_uniform16_at_half", "ihas_matches_dnis"}
        assert len(run["points"]) == len(bench.METHODS) * len(run["seeds"])
        assert all(p["epochs_run"] == 1 for p in run["points"])  # --quick: one epoch per fit, recorded
    assert (tmp_path / "dims_quick.png").exists()
    markdown = (tmp_path / "dims_quick.md").read_text()
    assert "| dnis |" in markdown and "| ihas |" in markdown and "## Targets" in markdown


def test_hpo_benchmark_quick(tmp_path: Path) -> None:
    """The HPO benchmark runs end to end at tiny size in worker processes (numbers meaningless)."""
    from experiments.benchmarks import hpo as bench

    assert bench.main(["--quick", "--jobs", "2", "--output", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "hpo_quick.json").read_text())
    assert result["quick"] and {"command", "date", "hardware", "versions", "targets", "seconds"} <= set(result)
    assert "frappe" not in result  # --quick never tunes Frappe
    analytic = result["analytic"]
    assert len(analytic["runs"]) == len(bench.QUICK["methods"]) * bench.QUICK["seeds"]
    for run in analytic["runs"]:
        assert run["final"] >= 0 and len(run["checkpoints"]) == bench.QUICK["budget"] // bench.CHECKPOINT_EVERY
    (task,) = analytic["tasks"].values()
    assert set(task["methods"]) == set(bench.QUICK["methods"])
    assert {"final", "auc", "curve"} <= set(task["methods"]["gif"])
    assert all("schedule" in r for r in analytic["runs"] if r["method"] == "gif")  # the GIF schedule was read
    assert "gif_competitive_low_d" in analytic["checks"]
    bayesmark = result["bayesmark"]
    assert set(bayesmark["mean_score"]) == set(bench.QUICK["bayesmark_methods"])
    assert (tmp_path / "hpo_quick.png").exists()
    markdown = (tmp_path / "hpo_quick.md").read_text()
    assert "| sphere-d5 | gif |" in markdown and "### Targets" in markdown
    (tmp_path / "hpo_quick.md").unlink()
    assert bench.main(["--render", str(tmp_path / "hpo_quick.json")]) == 0
    assert (tmp_path / "hpo_quick.md").read_text() == markdown


def test_generative_benchmark_quick(tmp_path: Path) -> None:
    """The generative benchmark's smoke run: synthetic sequences, every arm, one seed, one epoch."""
    from experiments.benchmarks import generative as bench

    assert bench.main(["--quick", "--output-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "generative_quick.json").read_text())
    assert result["quick"] is True
    summary = result["datasets"]["synthetic"]["summary"]
    assert set(summary) == set(bench.ARMS)
    for arm, stats in summary.items():
        assert 0.0 <= stats["ndcg@10"]["mean"] <= stats["recall@10"]["mean"] <= 1.0, arm
    assert "synthetic" in result["verdicts"]
    run = result["datasets"]["synthetic"]
    assert set(run["paired"]) == {f"{a} - {b}" for a, b in bench.PAIRS}  # every pair on the same test users
    for entry in run["paired"].values():
        assert set(entry) == set(bench.PAIRED_METRICS)
        assert all(e["low"] <= e["estimate"] <= e["high"] and len(e["per_seed"]) == 1 for e in entry.values())
    multi = run["paired"]["sid-multi - sid-plain"]["recall@10"]  # the paired mean is the difference of the means
    assert multi["estimate"] == pytest.approx(summary["sid-multi"]["recall@10"]["mean"] - summary["sid-plain"]["recall@10"]["mean"])
    assert result["verdicts"]["synthetic"]["rule"] == "per-user paired"
    assert all("_per_user" not in p and p["epochs_run"] == 1 for p in run["points"])
    assert run["sasrec_recall@10"]["low"] <= summary["sasrec"]["recall@10"]["mean"] <= run["sasrec_recall@10"]["high"]
    for low, high, verdict in ((0.057, 0.063, "met"), (0.050, 0.060, "inconclusive"), (0.040, 0.050, "NOT met")):
        got = bench._sasrec_verdict({"sasrec_recall@10": {"estimate": (low + high) / 2, "low": low, "high": high}})
        assert got is not None and got["verdict"].startswith(verdict)
    markdown = (tmp_path / "generative_quick.md").read_text()
    (tmp_path / "generative_quick.md").unlink()
    assert bench.main(["--render", str(tmp_path / "generative_quick.json")]) == 0
    assert (tmp_path / "generative_quick.md").read_text() == markdown
    # --merge with one arm: the other arms' points stay (with their command), the arm is measured again
    assert bench.main(["--quick", "--arms", "sasrec", "--merge", "--output-dir", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "generative_quick.json").read_text())["datasets"]["synthetic"]
    assert sorted(p["arm"] for p in merged["points"]) == sorted(bench.ARMS)
    kept = {p["arm"]: p for p in merged["points"]}
    assert kept["sid-plain"]["recall@10"] == run["points"][1]["recall@10"] and "--arms sasrec" not in kept["sid-plain"]["command"]
    assert "--arms sasrec" in kept["sasrec"]["command"] and set(merged["summary"]) == set(bench.ARMS)
    # per-user pairs only among arms measured together: the earlier run's pairs of SID arms stay as they were
    assert merged["paired"] == {k: v for k, v in run["paired"].items() if "sasrec" not in k}
    assert merged["sasrec_recall@10"] == run["sasrec_recall@10"]  # SASRec retrained on the same seed: deterministic
    # merging other arms keeps the SASRec interval computed from the kept SASRec points
    previous = json.loads((tmp_path / "generative_quick.json").read_text())
    sid_only = {**merged, "points": [p for p in merged["points"] if p["arm"] == "sid-plain"], "paired": {}}
    sid_only.pop("sasrec_recall@10")
    again = bench.merge_runs(previous, {"synthetic": sid_only}, ["sid-plain"])["synthetic"]
    assert again["sasrec_recall@10"] == merged["sasrec_recall@10"]
    assert again["paired"] == {k: v for k, v in merged["paired"].items() if "sid-plain" not in k}


def test_every_benchmark_but_the_pipeline_has_a_quick_smoke_test() -> None:
    """What experiments/benchmarks/README.md promises: a ``--quick`` mode and a test that runs it."""
    root = Path(__file__).resolve().parents[2]
    tests = {p: p.read_text() for p in (root / "tests" / "experiments").glob("test_*.py")}
    for script in sorted((root / "experiments" / "benchmarks").glob("[!_]*.py")):
        if script.stem == "pipeline":  # covered end to end by test_pipeline.py instead
            continue
        assert '"--quick"' in script.read_text(), script.name
        users = [p.name for p, text in tests.items()
                 if (f"benchmarks import {script.stem}" in text or f"benchmarks.{script.stem} import" in text)
                 and '"--quick"' in text]
        assert users, f"no test runs {script.name} --quick"
