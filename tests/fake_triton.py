"""A stand-in for Triton's CUDA driver and compiler, so the host side of a launch (the JIT's
dispatch and `kernels.program.BoundLaunch`) runs on a CPU: every compile yields a `FakeKernel`
whose launcher records its arguments instead of launching. Used by the bound-launch test and by
bench/host_launch.py (which times both paths' Python cost per launch without a GPU)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

STREAM = 0x5EED


class FakeLauncher:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


class FakeKernel:
    """What the JIT caches per compiled variant: `run` (the launcher), `function`, metadata."""

    def __init__(self, key: Any) -> None:
        self.key = key
        self.run = FakeLauncher()
        self.function = id(self)
        self.packed_metadata = ("packed", id(self))

    def launch_metadata(self, grid: Any, stream: Any, *args: Any) -> None:
        return None


class FakeDriver:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return STREAM

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)


@contextmanager
def fake_triton(jit_fn: Any) -> Iterator[list[FakeKernel]]:
    """Within: `jit_fn` dispatches through the fake driver and compiles to `FakeKernel`s (the
    list, in compile order)."""
    kernels: list[FakeKernel] = []

    def compile(key: Any, signature: Any, device: Any, constexprs: Any, options: Any,
                attrs: Any, warmup: Any) -> FakeKernel:
        kernel = FakeKernel(key)
        jit_fn.device_caches[device][0][key] = kernel
        kernels.append(kernel)
        return kernel

    before = driver._active
    caches = jit_fn.device_caches
    driver.set_active(FakeDriver())
    jit_fn.device_caches = type(caches)(jit_fn.create_binder)
    jit_fn._do_compile = compile
    try:
        yield kernels
    finally:
        del jit_fn._do_compile
        jit_fn.device_caches = caches
        driver._active = before


def fused_norm_state(stride: int = 4096, world: int = 2, grid: int = 4) -> Any:
    """A CPU `FusedNormState` for host-side launches of the fused kernel (bf16 buffer, zero
    counters): the bound-launch test and bench/host_launch.py launch through it."""
    import torch

    from hiercoll.kernels.fused_norm import FusedNormState
    from hiercoll.kernels.fused_norm_abi import ERR_WORDS, REGIONS, ll_area_words
    return FusedNormState(buf=torch.zeros(REGIONS * stride, dtype=torch.bfloat16),
                          buf_deltas=torch.zeros(world, dtype=torch.int64),
                          sig=torch.zeros(64, dtype=torch.int32),
                          sig_deltas=torch.zeros(world, dtype=torch.int64),
                          epoch=torch.zeros(grid, dtype=torch.int32),
                          err=torch.zeros(ERR_WORDS, dtype=torch.int64), rank=1, world=world,
                          grid=grid, stride=stride,
                          ll=torch.zeros(ll_area_words(world), dtype=torch.int64),
                          ll_deltas=torch.zeros(world, dtype=torch.int64))

