"""Device selection (``recsys.devices``) and the contract the GPU path relies on.

CUDA is simulated with monkeypatch where a test is about the error messages, so these run
the same on CPU and GPU machines.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from recsys import devices
from recsys.data.prepare import PrepareConfig
from recsys.devices import (
    CUDA_SKIP_REASON,
    DeviceError,
    cuda_available,
    describe_device,
    fbgemm_cuda_available,
    fbgemm_skip_reason,
    gpu_skip_reason,
    resolve_device,
)


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cuda_available", lambda: False)


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_auto_picks_cuda_when_visible_else_cpu() -> None:
    assert resolve_device("auto").type == ("cuda" if cuda_available() else "cpu")


def test_auto_is_cpu_without_cuda(no_cuda: None) -> None:
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("name", ["cpu", " CPU ", torch.device("cpu")])
def test_cpu(name: Any) -> None:
    assert resolve_device(name) == torch.device("cpu")


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "CUDA:1"])
def test_cuda_without_a_gpu_is_a_clear_error(no_cuda: None, name: str) -> None:
    with pytest.raises(DeviceError) as info:
        resolve_device(name)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert repr(name) in message  # names what was asked for
    assert "no CUDA device is visible" in message
    assert "--device cpu" in message and "trainer.accelerator: cpu" in message


def test_cuda_index_out_of_range(one_gpu: None) -> None:
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    with pytest.raises(DeviceError, match=r"'cuda:3'.*only 1 CUDA device\(s\) are visible \(cuda:0 \.\. cuda:0\)"):
        resolve_device("cuda:3")


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("tpu", r"unknown device 'tpu': expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        ("gpu", r"unknown device 'gpu'"),
        ("", r"unknown device ''"),
        ("cuda:x", r"'cuda:x': the CUDA index must be a non-negative integer"),
        ("cuda:-1", r"the CUDA index must be a non-negative integer"),
    ],
)
def test_unknown_names_are_clear_errors(name: str, match: str) -> None:
    with pytest.raises(DeviceError, match=match):
        resolve_device(name)


@pytest.mark.skipif(cuda_available(), reason="checks the answers on a machine without CUDA")
def test_checks_answer_false_without_cuda() -> None:
    assert fbgemm_cuda_available() is False  # must not raise with fbgemm-gpu-cpu installed
    assert gpu_skip_reason() == CUDA_SKIP_REASON
    assert fbgemm_skip_reason() == CUDA_SKIP_REASON
    info = describe_device(resolve_device("auto"))
    assert info["type"] == "cpu" and info["fbgemm_cuda_available"] is False and info["name"]


def _small_export_inputs() -> tuple[Any, Any]:
    from recsys.data.encoders import Preprocessor
    from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema

    features = (
        FeatureSpec("I1", FeatureKind.DENSE, transform=DenseTransform.LOG1P),
        FeatureSpec("C1", embedding_dim=4, hash_size=9),
        FeatureSpec("C2", embedding_dim=4, hash_size=29),
        FeatureSpec("tags", FeatureKind.MULTI_CATEGORICAL, embedding_dim=4, hash_size=19),
    )
    frame = pd.DataFrame({"I1": np.arange(4.0), "C1": list("abcd"), "C2": list("abcd"), "tags": ["a|b", "c", "", "d"]})
    pre = Preprocessor(Schema(features=features)).fit(frame)
    return pre.fitted_schema, pre


class _RecordOps(TorchDispatchMode):
    """Names of the operators dispatched inside the mode (from eager and TorchScript code)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def test_plain_kernel_path_calls_no_fbgemm_op(tmp_path: Any) -> None:
    """The GPU machines carry only ``fbgemm-gpu-cpu``, whose ``fbgemm::`` ops have CPU kernels
    alone: the plain-kernel training step and the exported module must reach no such op, or
    they would fail on a CUDA device. (``KeyedJaggedTensor.offsets()`` does call one: the
    control below, which also shows the recorder sees ``fbgemm::`` ops.)"""
    from recsys.data.batching import random_batch
    from recsys.export import export_model, kjt_to_lists, load_exported
    from recsys.models import DCNv2

    schema, pre = _small_export_inputs()
    torch.manual_seed(0)
    model = DCNv2(schema)
    batch = random_batch(schema, 8, seed=0, max_bag=3)
    export_model(model, pre, tmp_path / "export")
    scripted = load_exported(tmp_path / "export")
    values, lengths = kjt_to_lists(batch.sparse_features, schema.sparse_names)

    with _RecordOps() as rec:
        loss = F.binary_cross_entropy_with_logits(model(batch.dense_features, batch.sparse_features), batch.labels)
        loss.backward()
        with torch.no_grad():
            scripted(values, lengths, batch.dense_features)
    assert "aten._embedding_bag.default" in rec.ops  # the path ran
    assert not [op for op in rec.ops if op.startswith("fbgemm.")]

    with _RecordOps() as control:
        random_batch(schema, 4, seed=1).sparse_features.offsets()
    assert any(op.startswith("fbgemm.") for op in control.ops)


def test_fused_tables_on_cuda_without_the_cuda_fbgemm_is_a_clear_error() -> None:
    """FBGEMM's fused tables are rebuilt on the device (they cannot be moved); without the CUDA
    build of fbgemm-gpu that is refused with the way out, before anything is half-moved."""
    if devices.fbgemm_cuda_available():
        pytest.skip("this machine has the CUDA build of fbgemm-gpu")
    from recsys.data.prepare import SplitConfig, prepare_data
    from recsys.data.synthetic import SyntheticReader
    from recsys.models import DLRM
    from recsys.models.base import EmbeddingKernel, SparseArchConfig

    schema = prepare_data(SyntheticReader(n_rows=300, seed=0), PrepareConfig(SplitConfig(), embedding_dim=8)).schema
    model = DLRM(schema, SparseArchConfig(kernel=EmbeddingKernel.FUSED))
    before = model.sparse_arch.embedding_bag_collection
    model.sparse_arch.place_fused_tables(torch.device("cpu"))  # a no-op on the CPU
    assert model.sparse_arch.embedding_bag_collection is before
    with pytest.raises(RuntimeError, match=r"fused on CUDA needs the CUDA build of fbgemm-gpu.*requirements/gpu.txt.*embedding_kernel: grouped.*or plain"):
        model.sparse_arch.place_fused_tables(torch.device("cuda"))
    assert model.sparse_arch.embedding_bag_collection is before
