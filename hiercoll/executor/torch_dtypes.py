"""DType <-> torch dtype. Imports torch: backends only."""

from __future__ import annotations

import torch

from hiercoll.collectives import DType

TORCH_DTYPE: dict[DType, torch.dtype] = {
    DType.BF16: torch.bfloat16, DType.FP16: torch.float16,
    DType.FP32: torch.float32, DType.FP64: torch.float64,
}


def torch_dtype(dtype: DType) -> torch.dtype:
    return TORCH_DTYPE[dtype]

