"""Shared fixtures: GPU tests skip with the reason where there is no sm_90 GPU."""

import pytest
import torch


def gpu_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return f"loom's kernels are built for sm_90a, this GPU is sm_{major}{minor}"
    return None


requires_gpu = pytest.mark.skipif(gpu_reason() is not None, reason=f"GPU test skipped: {gpu_reason()}")
