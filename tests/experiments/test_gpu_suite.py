"""Smoke tests of ``experiments.benchmarks.gpu_suite``: the CPU run at tiny sizes (always), the
CUDA run (only where a GPU is visible). The numbers of a ``--quick`` run mean nothing; the
layout, positivity and the exported-vs-eager parity are checked."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from experiments.benchmarks import gpu_suite
from recsys.devices import cuda_available
from tests.helpers_gpu import requires_cuda

SECTIONS = {"copy_bandwidth", "embedding_lookup", "training", "h2d", "inference"}
PARITY_ATOL = 1e-4  # float32 eager vs TorchScript of the same weights: summation order only


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _run(tmp_path: Path, device: str) -> dict[str, Any]:
    assert gpu_suite.main(["--device", device, "--quick", "--output-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_suite.json").read_text())
    markdown = (tmp_path / "gpu_suite.md").read_text()
    assert "| section | metric | value | notes |" in markdown and "exported latency" in markdown
    return result


def _check_common(result: dict[str, Any], kernels: tuple[str, ...]) -> None:
    assert {"benchmark", "command", "date", "hardware", "versions", "quick", "device", "config", "sections"} <= set(
        result
    )
    assert result["benchmark"] == "gpu_suite" and result["quick"] is True and "--quick" in result["command"]
    assert {"name", "torch", "torch_cuda", "fbgemm_cuda_available"} <= set(result["device"])
    s = result["sections"]
    assert set(s) == SECTIONS
    assert all(_positive(v) for v in result["elapsed_s"].values()) and _positive(result["wall_seconds"])

    copy = s["copy_bandwidth"]
    assert all(_positive(copy["gb_per_s"][k]) for k in ("median", "min", "max", "p90"))

    lookup = s["embedding_lookup"]
    assert lookup["fields"] == 26 and len(lookup["cardinalities"]) == 26
    for kernel in kernels:
        for part in ("fwd_bwd", "forward"):
            block = lookup[kernel][part]
            for key in ("lookups_per_s", "effective_gb_per_s", "ratio_to_copy", "bytes_per_step"):
                assert _positive(block[key]), (kernel, part, key, block[key])
            assert _positive(block["ms_per_step"]["median"])
    assert _positive(lookup["plain"]["fwd_bwd"]["gb_per_s_with_dense_grad"])

    training = s["training"]["by_batch_size"]
    assert list(training) == [str(b) for b in result["config"]["train_batch_sizes"]]
    for block in training.values():
        assert _positive(block["samples_per_s"]["median"]) and _positive(block["ms_per_step"])
        assert math.isfinite(block["final_loss"])

    inference = s["inference"]
    assert list(inference["by_batch_size"]) == [str(b) for b in result["config"]["infer_batch_sizes"]]
    for block in inference["by_batch_size"].values():
        for timing in ("exported_ms", "eager_ms"):
            assert all(_positive(block[timing][k]) for k in ("median", "p90", "min"))
        assert block["exported_ms"]["p90"] >= block["exported_ms"]["median"]
        assert block["max_abs_diff"] < PARITY_ATOL
    assert inference["max_abs_diff"] < PARITY_ATOL and inference["export_parity_cpu"] < PARITY_ATOL


def test_quick_suite_on_cpu(tmp_path: Path) -> None:
    result = _run(tmp_path, "cpu")
    _check_common(result, kernels=("plain", "fused"))  # the fused kernel runs on CPU (fbgemm-gpu-cpu)
    assert result["device"]["type"] == "cpu"
    assert result["sections"]["h2d"] == {
        "applicable": False,
        "reason": "device is cpu: there is no host-to-device transfer to time",
    }
    assert result["sections"]["inference"]["placement"]["moved_to_device"] is True


def test_cpu_sizes_are_scaled_down_and_said_so() -> None:
    cfg, note = gpu_suite.config_for(gpu_suite.resolve_device("cpu"), gpu_suite.parse_args(["--device", "cpu"]))
    assert cfg == gpu_suite.SuiteConfig.cpu() and "scaled down for the CPU" in note
    cfg, _ = gpu_suite.config_for(
        gpu_suite.resolve_device("cpu"),
        gpu_suite.parse_args(["--quick", "--batch-sizes", "32", "--max-cardinality", "50"]),
    )
    assert (
        cfg.train_batch_sizes == (32,)
        and cfg.max_cardinality == 50
        and cfg.lookup_dim == gpu_suite.SuiteConfig.quick().lookup_dim
    )


@pytest.mark.skipif(cuda_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_exits_with_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_suite.main(["--device", "cuda", "--quick", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'cuda'" in err and "no CUDA device is visible" in err and "--device cpu" in err
    assert not (tmp_path / "gpu_suite.json").exists()


@requires_cuda
def test_quick_suite_on_cuda(tmp_path: Path) -> None:
    """The same suite on the GPU: the plain kernel runs on torch's CUDA kernels even with only
    fbgemm-gpu-cpu; the fused kernel is timed only with the CUDA build of fbgemm-gpu."""
    result = _run(tmp_path, "cuda")
    fbgemm_cuda = result["device"]["fbgemm_cuda_available"]
    _check_common(result, kernels=("plain", "fused") if fbgemm_cuda else ("plain",))
    if not fbgemm_cuda:
        assert "skipped" in result["sections"]["embedding_lookup"]["fused"]
    assert result["device"]["type"] == "cuda" and result["hardware"]["gpu"] == result["device"]["name"]
    h2d = result["sections"]["h2d"]
    assert h2d["applicable"] is True
    for block in h2d["by_batch_size"].values():
        assert _positive(block["pinned"]["ms_per_batch"]["median"]) and _positive(block["pinned"]["gb_per_s"])
        assert _positive(block["pageable"]["ms_per_batch"]["median"])
    inference = result["sections"]["inference"]
    assert inference["placement"]["moved_to_device"] is True, inference["placement"]
    assert inference["device"].startswith("cuda")
