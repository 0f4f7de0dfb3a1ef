"""The host <-> tensor conversions of the stress's numpy reference (`executor.torch_dtypes`):
exact both ways in every dtype, specials included, so a faster path cannot change what the stress
compares."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hiercoll.collectives import DType, round_to  # noqa: E402
from hiercoll.executor.torch_dtypes import float64_of, tensor_of, torch_dtype  # noqa: E402


@pytest.mark.parametrize("dtype", list(DType))
def test_values_rounded_to_a_dtype_cross_to_torch_and_back_bit_for_bit(dtype):
    rng = np.random.default_rng(7)
    values = round_to(rng.uniform(-3, 3, 4099) * np.exp2(rng.integers(-8, 8, 4099)), dtype)
    values[:4] = [np.nan, np.inf, -np.inf, -0.0]
    t = tensor_of(values, dtype, torch.device("cpu"))
    cast = torch.from_numpy(np.asarray(values)).to(torch_dtype(dtype))    # torch's own cast
    assert t.dtype == cast.dtype and t.shape == cast.shape
    nan = torch.isnan(cast)
    assert torch.equal(torch.isnan(t), nan)              # a NaN (torch's cast picks its own bits)
    assert torch.equal(t[~nan].view(torch.uint8), cast[~nan].view(torch.uint8))   # the same bits
    back = float64_of(t[1::2])                                 # a strided view, read exactly
    want = cast[1::2].double().numpy()
    assert np.array_equal(back, want, equal_nan=True)
    assert np.signbit(float64_of(t)[3])


def test_unrounded_values_round_to_nearest_even_as_torch_casts_them():
    values = np.random.default_rng(3).uniform(-3, 3, 5000)
    t = tensor_of(values, DType.BF16, torch.device("cpu"))
    assert torch.equal(t, torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16))

