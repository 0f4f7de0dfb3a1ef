"""DType <-> torch dtype. Imports torch: backends only."""

from __future__ import annotations

import numpy as np
import torch

from hiercoll.collectives import DType, round_to, storage_dtype

TORCH_DTYPE: dict[DType, torch.dtype] = {
    DType.BF16: torch.bfloat16, DType.FP16: torch.float16,
    DType.FP32: torch.float32, DType.FP64: torch.float64,
}


def torch_dtype(dtype: DType) -> torch.dtype:
    return TORCH_DTYPE[dtype]


def tensor_of(values: np.ndarray, dtype: DType, device: torch.device) -> torch.Tensor:
    """numpy values as a tensor of `dtype` on `device`, rounded to nearest even as torch's cast
    does (NaN aside: torch's cast writes its own NaN bits), without torch's CPU cast: a bf16
    value is the high half of its float32 bits once `collectives.round_to` rounded it. Why:
    torch's CPU float32 -> bfloat16 cast took ~15 ms for the 184k elements of one TP-shape
    stress input on the 2-core machine (the bit view: 0.2 ms), and the stress draws every
    iteration's inputs on the host."""
    values = np.ascontiguousarray(values, dtype=storage_dtype(dtype))
    if dtype == DType.BF16:
        values = round_to(values, dtype)      # idempotent on rounded values; exact for any
        high = (values.view(np.uint32) >> 16).astype(np.uint16)
        return torch.from_numpy(high.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(values).to(device)


def float64_of(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as float64 numpy, exactly (the inverse of `tensor_of`'s bit view for
    bf16; the cast happens in numpy, after a copy of the tensor's own bytes)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        high = t.view(torch.int16).cpu().numpy().view(np.uint16).astype(np.uint32) << 16
        return high.view(np.float32).astype(np.float64)
    return t.cpu().numpy().astype(np.float64)

