"""The unfused reference of all-reduce + residual add + RMSNorm, the math every fused kernel is
checked against.

    unfused_add_rms_norm(partials, residual, weight, eps) -> (normed, new_residual)

- `partials`: either the list of every rank's un-reduced tensor (the reference does the
  all-reduce itself, summing in fp32) or one tensor that already is the sum (any float dtype,
  fp32 for an exact sum). Shape `[..., hidden]`.
- `residual`: `[..., hidden]`, the activation dtype (bf16 in practice); its dtype is the dtype of
  both outputs.
- `weight`: `[hidden]`; `eps`: the RMSNorm epsilon.

Steps, each rounding where a real pipeline rounds (so a fused kernel that is right matches it to
one bf16 ulp or so, and one that skips a rounding shows):
1. all-reduce: `x = sum(partials)` in fp32, rounded once to the activation dtype (what an
   all-reduce with fp32 accumulation delivers);
2. residual add: `new_residual = (x + residual)` in fp32, rounded to the activation dtype;
3. RMSNorm over the last dim, from the *rounded* `new_residual` (what the next layer's kernel
   would read back): `normed = new_residual * rsqrt(mean(new_residual**2) + eps) * weight`,
   computed in fp32 and rounded once.

Pure torch, no process group: the gloo communicator calls it after its own all-reduce, and the
fused kernel's stress harness calls it with the list of every rank's partials.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def reduce_partials_fp32(partials: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """The all-reduce's sum in fp32 (a tensor is taken as the sum already)."""
    if isinstance(partials, torch.Tensor):
        return partials.float()
    if len(partials) == 0:
        raise ValueError("partials: an empty list; pass every rank's tensor (or the sum)")
    acc = partials[0].float().clone()
    for p in partials[1:]:
        acc += p.float()
    return acc


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, in fp32, rounded once to `x`'s dtype."""
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * inv * weight.float()).to(x.dtype)


def unfused_add_rms_norm(partials: torch.Tensor | Sequence[torch.Tensor], residual: torch.Tensor,
                         weight: torch.Tensor, eps: float,
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, new_residual); see the module docstring for the exact rounding points."""
    x_sum = reduce_partials_fp32(partials)
    if x_sum.shape != residual.shape:
        raise ValueError(f"residual: shape {tuple(residual.shape)}, the reduced input is "
                         f"{tuple(x_sum.shape)}; they must match")
    if weight.shape != residual.shape[-1:]:
        raise ValueError(f"weight: shape {tuple(weight.shape)}, needs ({residual.shape[-1]},) "
                         "(the hidden size)")
    dtype = residual.dtype
    x = x_sum.to(dtype)
    new_residual = (x.float() + residual.float()).to(dtype)
    return rms_norm(new_residual, weight, eps), new_residual
