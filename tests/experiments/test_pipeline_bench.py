"""The pipeline benchmark's verdicts and table, on a hand-made compare result."""

from __future__ import annotations

from experiments.benchmarks.pipeline import to_markdown, verdicts


def _model(n: int, params: int, auc: float) -> dict:
    return {"n_features": n, "features": [f"f{i}" for i in range(n)], "embedding_parameters": params, "test_auc": auc,
            "test_logloss": 0.3, "export_bytes": 10_240 * n, "parity_max_abs_diff": 0.0, "dims": {"f0": 8},
            "latency_ms": {"1": {"median": 0.2, "p90": 0.3}, "1024": {"median": 3.0, "p90": 3.5}}}


def _compare(final_auc: float, final_n: int = 3, final_params: int = 500) -> dict:
    o, f = _model(10, 1000, 0.9600), _model(final_n, final_params, final_auc)
    return {"original": o, "final": f, "auc_tolerance": 0.002, "within_tolerance": True,
            "delta": {"n_features": final_n - 10, "embedding_parameters": final_params - 1000,
                      "embedding_parameters_ratio": final_params / 1000, "test_auc": final_auc - 0.96,
                      "test_logloss": 0.0, "export_bytes_ratio": final_n / 10, "latency_ratio": {"1": 1.0, "1024": 1.0}}}


def test_verdicts() -> None:
    assert verdicts(_compare(0.9590)) == {"fewer_features": True, "fewer_embedding_parameters": True, "test_auc_within": True}
    assert not verdicts(_compare(0.9570))["test_auc_within"]  # 0.003 below
    assert verdicts(_compare(0.9700))["test_auc_within"]  # better is never a miss
    v = verdicts(_compare(0.96, final_n=10, final_params=1000))
    assert not v["fewer_features"] and not v["fewer_embedding_parameters"]


def test_table_says_what_was_met() -> None:
    compare = _compare(0.9570)
    result = {"pipeline": "frappe", "command": "python -m experiments.benchmarks.pipeline ", "config": "x.yaml",
              "date": "2026-11-30", "hardware": {"cpu": "cpu", "cores": 2}, "seconds": 60.0,
              "stage_seconds": {"quality": {"seconds": 1.0}}, "stages": {}, "compare": compare,
              "verdicts": verdicts(compare)}
    md = to_markdown(result)
    assert "| features | 10 | 3 | -7 (met) |" in md
    assert "not more than 0.002 below: NOT met" in md and "| quality | 1 |" in md


def test_the_paired_interval_decides_when_there_is_one() -> None:
    # a point estimate of -0.0010 passes unpaired; its interval reaching -0.0150 (1,000 test rows) does not
    compare = _compare(0.9590)
    compare["test_auc_interval"] = {"estimate": -0.0010, "low": -0.0150, "high": 0.0130, "level": 0.95, "se": 0.0071,
                                    "method": "delong", "n": 1000}
    compare["verdict"] = "tie"
    assert not verdicts(compare)["test_auc_within"]
    compare["test_auc_interval"] = {**compare["test_auc_interval"], "low": -0.0018, "high": -0.0002}
    compare["verdict"] = "worse"
    assert verdicts(compare)["test_auc_within"]  # worse, but no worse than the tolerance at the far end
    result = {"pipeline": "frappe", "command": "x", "config": "x.yaml", "date": "2026-11-30",
              "hardware": {"cpu": "cpu", "cores": 2}, "seconds": 60.0, "stage_seconds": {}, "stages": {},
              "compare": compare, "verdicts": verdicts(compare)}
    assert "[-0.0018, -0.0002] 95% paired on 1,000 test rows (DeLong), worse" in to_markdown(result)
