"""DType <-> torch dtype, and the dtype reductions accumulate in. Imports torch: backends only."""

from __future__ import annotations

import torch

from hiercoll.collectives import DType

TORCH_DTYPE: dict[DType, torch.dtype] = {
    DType.BF16: torch.bfloat16, DType.FP16: torch.float16,
    DType.FP32: torch.float32, DType.FP64: torch.float64,
}


def torch_dtype(dtype: DType) -> torch.dtype:
    return TORCH_DTYPE[dtype]


def accumulate_dtype(dtype: DType, device_type: str) -> torch.dtype:
    """fp32 for 16-bit types (round once at the end, like the GPU kernels); fp64 on CPU for fp32
    so the CPU path matches the numpy reference bit for bit where it can."""
    if dtype == DType.FP64 or (dtype == DType.FP32 and device_type == "cpu"):
        return torch.float64
    return torch.float32
