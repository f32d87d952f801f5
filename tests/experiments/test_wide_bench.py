"""The wide benchmark's smoke run (its numbers mean nothing): every part but the pipeline (which
tests/experiments/test_pipeline.py runs end to end) on a tiny wide dataset, two selectors."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.benchmarks import wide


def test_wide_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "results"
    # the curves of two selectors (each gate baseline's selector passes the contract tests;
    # the curve worker is the same for all)
    assert wide.main(["--quick", "--parts", "rank,io,throughput,curves", "--methods", "leap,outrank",
                      "--curve-methods", "leap,outrank", "--root", str(tmp_path / "root"), "--output-dir", str(out)]) == 0
    result = json.loads((out / "wide_quick.json").read_text())
    rank = result["rank"]["100"]
    ranked = {m for m, r in rank.items() if not r.get("from_curves")}
    assert rank["fit"]["seconds"] > 0 and ranked == {"fit", "leap", "outrank"}
    assert set(rank) - ranked <= set(wide.CURVE_METHODS)  # the curves part's seed-0 rankings fill the rest
    for m in ("leap", "outrank"):
        assert 0.0 <= rank[m]["recall"] <= 1.0 and rank[m]["peak_rss_mb"] > 0 and "error" not in rank[m]
    assert set(rank["leap"]["ablations"]) == {"none", "sum"} and rank["leap"]["fusion"] == "sum"  # F = 100 > 64 fields
    assert result["io"]["100"]["quality"]["exit"] == 0 and result["io"]["outrank_full_vs_relevance"]["ratios"]
    assert result["throughput"]["profile"]["per_feature_overhead_share"] > 0
    assert set(result["curves"]["methods"]) == {"leap", "outrank"}
    assert (out / "wide_quick.md").read_text().startswith("# Wide benchmark") and (out / "wide_quick.png").exists()


def test_parts_run_apart_merge_per_width_and_selector() -> None:
    result = {"rank": {"100": {"fit": {"seconds": 1.0}, "leap": {"recall": 0.5}}}, "io": {"old": 1}}
    wide._merge_parts(result, {"rank": {"100": {"leap": {"recall": 0.9}}, "5000": {"lasso": {"refused": "x"}}},
                               "curves": {"features": 1000}, "unrelated": 1})
    assert result["rank"]["100"] == {"fit": {"seconds": 1.0}, "leap": {"recall": 0.9}}
    assert result["rank"]["5000"] == {"lasso": {"refused": "x"}}
    assert result["io"] == {"old": 1} and result["curves"] == {"features": 1000} and "unrelated" not in result


def test_curve_rankings_fill_the_rank_table() -> None:
    ranking = {"method": "leap", "seed": 0, "recall": 0.9, "cost_seconds": 30.0}
    result = {"rank": {"1000": {"fit": {"seconds": 20.0}, "lasso": {"recall": 0.5}}},
              "curves": {"features": 1000, "methods": {"leap": {"runs": [{"ranking": ranking}, {"ranking": {**ranking, "seed": 1}}]},
                                                       "lasso": {"runs": [{"ranking": {**ranking, "method": "lasso"}}]}}}}
    wide._rank_from_curves(result)
    rows = result["rank"]["1000"]
    assert rows["leap"]["from_curves"] and rows["leap"]["cost_runs"] == 1.5 and rows["lasso"] == {"recall": 0.5}


def test_results_name_no_machine_folders(tmp_path: Path) -> None:
    from experiments.benchmarks._wide_report import portable

    root = tmp_path / "bench"
    value = {"report": str(root / "work" / "r.json"), "out": "/tmp/x/wide.json", "n": 3, "rel": "a/b"}
    assert portable(value, root) == {"report": "work/r.json", "out": "wide.json", "n": 3, "rel": "a/b"}
    assert wide.portable_command("python -m experiments.benchmarks.wide --merge --output-dir /tmp/a --parts io "
                                 "--merge-from /tmp/b.json:rank --root=/x") == \
        "python -m experiments.benchmarks.wide --merge --parts io"
