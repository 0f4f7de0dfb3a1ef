"""hiercoll.torch.reference: the unfused all-reduce + residual add + RMSNorm the fused kernel is
checked against. Hand-computed values, the rounding points, and the argument checks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hiercoll.torch.reference import rms_norm, unfused_add_rms_norm  # noqa: E402


def _naive(parts: list, residual, weight, eps: float):  # type: ignore[no-untyped-def]
    x = torch.stack([p.double() for p in parts]).sum(0).to(residual.dtype)
    h = (x.double() + residual.double()).to(residual.dtype)
    hd = h.double()
    normed = hd / torch.sqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    return normed.to(residual.dtype), h


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_list_of_partials_matches_a_float64_recomputation(ranks: int) -> None:
    g = torch.Generator().manual_seed(ranks * 7 + int(torch.randint(0, 1 << 30, ()).item()))
    parts = [torch.randn(3, 5, 64, generator=g).bfloat16() for _ in range(ranks)]
    residual = torch.randn(3, 5, 64, generator=g).bfloat16()
    weight = (torch.rand(64, generator=g) + 0.5).bfloat16()
    normed, new_res = unfused_add_rms_norm(parts, residual, weight, 1e-6)
    want_n, want_r = _naive(parts, residual, weight, 1e-6)
    assert normed.dtype == new_res.dtype == torch.bfloat16
    assert torch.equal(new_res, want_r)
    torch.testing.assert_close(normed, want_n, atol=0, rtol=2 ** -7)   # one bf16 ulp


def test_a_summed_tensor_gives_the_same_as_its_partials() -> None:
    parts = [torch.randn(4, 32).bfloat16() for _ in range(3)]
    residual, weight = torch.randn(4, 32).bfloat16(), torch.randn(32).bfloat16()
    summed = sum(p.float() for p in parts)
    a = unfused_add_rms_norm(parts, residual, weight, 1e-5)
    b = unfused_add_rms_norm(summed, residual, weight, 1e-5)   # type: ignore[arg-type]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_hand_computed_row() -> None:
    x = torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, 0.0]])   # sum (3, 1)
    residual = torch.tensor([[1.0, -5.0]])                      # h = (4, -4), rms = 4
    weight = torch.tensor([0.5, 2.0])
    normed, new_res = unfused_add_rms_norm(list(x), residual, weight, 0.0)
    assert new_res.tolist() == [[4.0, -4.0]]
    assert normed.tolist() == [[0.5, -2.0]]


def test_the_norm_reads_the_rounded_residual() -> None:
    """The norm starts from the bf16-rounded residual: equal to re-normalising the returned
    residual, and (on enough random rows) not equal to normalising the unrounded fp32 sum."""
    parts = [torch.randn(64, 256).bfloat16() for _ in range(2)]
    residual, weight = torch.randn(64, 256).bfloat16(), torch.randn(256).bfloat16()
    normed, new_res = unfused_add_rms_norm(parts, residual, weight, 1e-6)
    assert torch.equal(normed, rms_norm(new_res, weight, 1e-6))
    unrounded = sum(p.float() for p in parts).bfloat16().float() + residual.float()
    skipped = rms_norm(unrounded, weight, 1e-6).bfloat16()   # type: ignore[arg-type]
    assert not torch.equal(normed, skipped)


def test_bad_shapes_name_the_argument() -> None:
    with pytest.raises(ValueError, match="residual"):
        unfused_add_rms_norm(torch.ones(2, 4), torch.ones(2, 5), torch.ones(5), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        unfused_add_rms_norm(torch.ones(2, 4), torch.ones(2, 4), torch.ones(3), 1e-6)
    with pytest.raises(ValueError, match="partials"):
        unfused_add_rms_norm([], torch.ones(2, 4), torch.ones(4), 1e-6)
