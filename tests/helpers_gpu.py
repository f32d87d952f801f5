"""Skip markers for GPU-only tests, with readable reasons.

The default suite runs on CPU machines with the CPU build ``fbgemm-gpu-cpu``; a GPU-only
test is marked so it is skipped there (the CPU suite covers the same code with
``--device cpu``) and runs wherever torch sees a CUDA device::

    from tests.helpers_gpu import requires_cuda

    @requires_cuda
    def test_suite_on_cuda(tmp_path): ...
"""

from __future__ import annotations

import pytest

from recsys.devices import CUDA_SKIP_REASON, FBGEMM_CUDA_SKIP_REASON, cuda_available, fbgemm_cuda_available

__all__ = ["requires_cuda", "requires_fbgemm_cuda"]

#: the test needs a visible CUDA device (the plain embedding kernel is enough)
requires_cuda = pytest.mark.skipif(not cuda_available(), reason=CUDA_SKIP_REASON)
#: the test needs the CUDA build of fbgemm-gpu (fused kernel on the GPU)
requires_fbgemm_cuda = pytest.mark.skipif(not fbgemm_cuda_available(), reason=FBGEMM_CUDA_SKIP_REASON)
