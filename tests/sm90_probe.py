"""The smallest Triton kernel: whether this machine's Triton can compile for sm_90 at all
(tests/helpers.compile_sm90_ptx skips only where it cannot)."""

import triton
import triton.language as tl


@triton.jit
def store_one(p):
    tl.store(p, 1)
