"""Which device to run on, and whether CUDA and FBGEMM's CUDA kernels are usable here.

Every GPU path in the project is switchable: ``--device auto|cpu|cuda|cuda:N`` on the
command line, ``trainer.accelerator`` in configs. :func:`resolve_device` turns the name into a
``torch.device`` and refuses, with an error that says what to do instead, a CUDA device that
is not there::

    resolve_device("auto")    # cuda:0 on a GPU machine, cpu elsewhere
    resolve_device("cuda:1")  # DeviceError naming the visible devices if there is no cuda:1

Two levels of GPU support are told apart:

* :func:`cuda_available`: torch sees a CUDA device. Enough for the plain embedding kernel
  (torchrec ``EmbeddingBagCollection`` on torch's own CUDA ``nn.EmbeddingBag`` kernels, which
  calls no ``fbgemm::`` op), so it runs with the CPU build ``fbgemm-gpu-cpu`` installed.
* :func:`fbgemm_cuda_available`: additionally the CUDA build of ``fbgemm_gpu`` is loaded and
  its table-batched-embedding (TBE) kernels run: needed for the fused kernel on a GPU.

Nothing here raises on a machine without CUDA; the checks answer False there.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = [
    "CUDA_SKIP_REASON",
    "FBGEMM_CUDA_SKIP_REASON",
    "DeviceError",
    "cuda_available",
    "describe_device",
    "fbgemm_cuda_available",
    "fbgemm_skip_reason",
    "gpu_skip_reason",
    "resolve_device",
]

CUDA_SKIP_REASON = "needs a CUDA GPU (none visible); the CPU suite covers the same code with --device cpu"
FBGEMM_CUDA_SKIP_REASON = (
    "needs the CUDA build of fbgemm-gpu (only the CPU build, or no GPU, here); "
    "the plain embedding kernel covers the same model without it"
)
#: an op the CUDA build of fbgemm_gpu registers and the CPU build does not have at all
_TBE_CUDA_OP = "fbgemm::split_embedding_codegen_forward_unweighted_cuda"
_CPU_HINT = "run on the CPU with --device cpu (trainer.accelerator: cpu in a config)"


class DeviceError(ValueError):
    """A device name that is unknown or not available on this machine."""


def cuda_available() -> bool:
    """True when torch sees at least one CUDA device (never raises)."""
    try:
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001 - a broken driver counts as "no GPU", not as a crash
        return False


@functools.lru_cache(maxsize=1)
def fbgemm_cuda_available() -> bool:
    """True when the CUDA build of ``fbgemm_gpu`` is loaded and its TBE kernels run on the GPU.

    Checks, in order: a CUDA device is visible; ``fbgemm_gpu`` imports; its CUDA TBE forward
    op is registered (the CPU build ``fbgemm-gpu-cpu`` has no such op); a one-table
    ``SplitTableBatchedEmbeddingBagsCodegen`` on the GPU runs a forward and backward. Any
    failure answers False (never raises). The answer is cached for the process.
    """
    if not cuda_available():
        return False
    try:
        # loads the fbgemm:: op libraries, the table-batched-embedding ones included
        import fbgemm_gpu.split_table_batched_embeddings_ops_training  # noqa: F401

        if _TBE_CUDA_OP not in torch._C._dispatch_get_all_op_names():
            return False
        return _tbe_probe()
    except Exception:  # noqa: BLE001 - missing build, ABI mismatch, driver error: not usable
        return False


def _tbe_probe() -> bool:
    """Run a tiny FBGEMM TBE lookup (4 rows x 4 dims, 2 bags) forward and backward on the GPU."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    device = torch.device("cuda", torch.cuda.current_device())
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(4, 4, EmbeddingLocation.DEVICE, ComputeDevice.CUDA)],
        optimizer=EmbOptimType.EXACT_SGD,
        learning_rate=0.0,
        device=device,
    )
    indices = torch.tensor([0, 1, 3], dtype=torch.int64, device=device)
    offsets = torch.tensor([0, 2, 3], dtype=torch.int64, device=device)
    out = tbe(indices, offsets)
    out.sum().backward()
    torch.cuda.synchronize(device)
    return tuple(out.shape) == (2, 4)


def gpu_skip_reason() -> str | None:
    """Why a GPU-only test or benchmark part cannot run here, or None when CUDA is visible."""
    return None if cuda_available() else CUDA_SKIP_REASON


def fbgemm_skip_reason() -> str | None:
    """Why an FBGEMM-CUDA part cannot run here, or None when :func:`fbgemm_cuda_available`."""
    if not cuda_available():
        return CUDA_SKIP_REASON
    return None if fbgemm_cuda_available() else FBGEMM_CUDA_SKIP_REASON


def resolve_device(name: str | torch.device) -> torch.device:
    """The ``torch.device`` for a device name, checked against what this machine has.

    Args:
        name: ``"auto"`` (the current CUDA device when one is visible, else the CPU),
            ``"cpu"``, ``"cuda"`` (the current CUDA device) or ``"cuda:N"``; case and
            surrounding spaces are ignored. A ``torch.device`` is accepted too.

    Returns:
        torch.device: ``cpu`` or ``cuda:N`` with an explicit index.

    Raises:
        DeviceError: an unknown name, CUDA asked for on a machine where torch sees no CUDA
            device, or a CUDA index beyond the visible devices. The message names what was
            asked for and how to run on the CPU instead.

    Example::

        device = resolve_device(args.device)
        model.to(device)
    """
    text = str(name).strip().lower()
    if text == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if cuda_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    kind, sep, index_text = text.partition(":")
    if kind != "cuda":
        raise DeviceError(f"unknown device {str(name)!r}: expected 'auto', 'cpu', 'cuda' or 'cuda:N' (N = 0, 1, ...)")
    if sep and not index_text.isdigit():
        raise DeviceError(f"device {str(name)!r}: the CUDA index must be a non-negative integer, as in 'cuda:0'")
    if not cuda_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        raise DeviceError(
            f"device {str(name)!r} was asked for, but no CUDA device is visible "
            f"(torch {torch.__version__}, {build}); {_CPU_HINT}, or use --device auto"
        )
    count = torch.cuda.device_count()
    index = int(index_text) if sep else torch.cuda.current_device()
    if index >= count:
        raise DeviceError(
            f"device {str(name)!r} was asked for, but only {count} CUDA device(s) are visible "
            f"(cuda:0 .. cuda:{count - 1}); pick one of those, or {_CPU_HINT}"
        )
    return torch.device("cuda", index)


def describe_device(device: torch.device) -> dict[str, Any]:
    """What a benchmark result should record about ``device``: its name, the torch and CUDA
    versions, memory and compute capability (CUDA), thread count (CPU), and whether the
    FBGEMM CUDA kernels are usable."""
    out: dict[str, Any] = {
        "device": str(device),
        "type": device.type,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,  # None on a CPU-only build
        "cuda_available": cuda_available(),
        "fbgemm_cuda_available": fbgemm_cuda_available(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            cudnn=torch.backends.cudnn.version(),
            tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
        )
    else:
        out.update(name=_cpu_name(), threads=torch.get_num_threads())
    return out


def _cpu_name() -> str:
    """The CPU model from ``/proc/cpuinfo`` (Linux), else what :mod:`platform` says."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
