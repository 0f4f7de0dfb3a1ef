"""Bound launches (kernels.program.BoundLaunch) hand Triton's launcher exactly what the JIT's
dispatch hands it: same binary, grid, stream, function and arguments. Run on CPU through a fake
driver and compiler (tests/fake_triton.py): the launcher records instead of launching."""

from __future__ import annotations

import random

import pytest
import torch
import triton

from hiercoll.kernels.abi import ERR_WORDS, RowSpan
from hiercoll.kernels.program import KernelState, _program_kernel, bind_launch, launch_rows, warm_up
from tests.fake_triton import STREAM, fake_triton, fused_norm_state


def _state(dtype: torch.dtype) -> KernelState:
    n = random.randint(64, 4096)
    return KernelState(table=torch.randint(0, 9, (n,), dtype=torch.int64),
                       data=torch.randn(n * 8).to(dtype), sig=torch.zeros(n, dtype=torch.int32),
                       epoch=torch.zeros(1, dtype=torch.int32),
                       err=torch.zeros(ERR_WORDS, dtype=torch.int64))


@pytest.mark.parametrize("dtype,reduce_op", [(torch.bfloat16, "sum"), (torch.float32, "max"),
                                             (torch.float64, "avg")])
def test_bound_launch_matches_the_jit_dispatch(monkeypatch, dtype, reduce_op):
    monkeypatch.setenv("TRITON_INTERPRET", "1")   # kernel args' CUDA check: CPU tensors here
    state = _state(dtype)
    spin = random.choice([0, random.randint(1, 10**6)])
    with fake_triton(_program_kernel) as kernels:
        every = [(a, b, f, m) for a in (False, True) for m in (False, True)
                 for b, f in ((False, False), (True, False), (False, True))]
        compiled = warm_up(state, reduce_op, spin, every)
        assert len(compiled) == 12 and len({id(k) for k in compiled.values()}) == 12
        for aligned, bump, fused, also in compiled:
            grid = 1 if bump else random.randint(1, 32)
            span = RowSpan(random.randint(0, 50), random.randint(1, 50), grid, aligned, also)
            jit_kernel = launch_rows(state, span, reduce_op=reduce_op, spin_limit=spin,
                                     bump_epoch=bump, fused=fused)
            assert jit_kernel is compiled[(aligned, bump, fused, also)]   # no new compile
            bound = bind_launch(state, span, compiled, reduce_op=reduce_op, spin_limit=spin,
                                bump_epoch=bump, fused=fused)
            assert bound is not None
            bound(STREAM)
            jit_call, bound_call = jit_kernel.run.calls[-2:]
            # grid x3, stream, function, packed metadata | metadata, hooks | the kernel's args
            assert bound_call[:6] == jit_call[:6] == (grid, 1, 1, STREAM, jit_kernel.function,
                                                      jit_kernel.packed_metadata)
            assert bound_call[6:9] == (None, None, None)
            assert len(bound_call[9:]) == len(jit_call[9:]) == 19   # the signature, ALSO included
            for a, b in zip(bound_call[9:], jit_call[9:], strict=True):
                assert a is b or a == b
        assert len(kernels) == 12
        assert len(warm_up(state, reduce_op, spin)) == 6     # no ALSO variants unless asked
        assert list(warm_up(state, reduce_op, spin, [(True, False, True, True)])) == [
            (True, False, True, True)]                     # only what the program launches


def test_no_bound_launch_without_a_binary_with_a_profiler_hook_or_when_asked(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    state = _state(torch.float32)
    span = RowSpan(0, 3, 4, True)
    assert bind_launch(state, span, {}, reduce_op="sum") is None          # the interpreter
    with fake_triton(_program_kernel):
        compiled = warm_up(state, "sum")
        assert bind_launch(state, span, compiled, reduce_op="sum") is not None

        def hook(metadata):
            return None
        triton.knobs.runtime.launch_enter_hook.add(hook)
        try:
            assert bind_launch(state, span, compiled, reduce_op="sum") is None
        finally:
            triton.knobs.runtime.launch_enter_hook.remove(hook)
        monkeypatch.setenv("HIERCOLL_JIT_LAUNCH", "1")   # asked for: every launch through the JIT
        assert bind_launch(state, span, compiled, reduce_op="sum") is None
        monkeypatch.setenv("HIERCOLL_JIT_LAUNCH", "0")
        assert bind_launch(state, span, compiled, reduce_op="sum") is not None


def test_an_eager_fused_norm_call_skips_the_jit_after_its_first(monkeypatch):
    """The fused all-reduce + RMSNorm's second call of a specialisation goes straight to the
    compiled binary's launcher with exactly the JIT's arguments; another row count (not
    specialised) shares the binary, while another hidden size or a tensor off 16-byte alignment
    (both specialised by the JIT) dispatch through the JIT again."""
    from hiercoll.kernels.fused_norm import _BOUND, _fused_norm_kernel, launch
    monkeypatch.setenv("TRITON_INTERPRET", "1")   # the CUDA-tensor check: CPU tensors here
    state = fused_norm_state()

    def call(rows, hidden, offset=0):  # type: ignore[no-untyped-def]
        x = torch.randn(rows * hidden + offset).to(torch.bfloat16)[offset:].view(rows, hidden)
        res, out, res_out = (torch.randn(rows, hidden).to(torch.bfloat16) for _ in range(3))
        launch(state, x, res, torch.ones(hidden, dtype=torch.bfloat16), out, res_out, 1e-6, 1)

    _BOUND.clear()
    with fake_triton(_fused_norm_kernel) as kernels:
        call(4, 256)
        assert len(kernels) == 1 and len(kernels[0].run.calls) == 1      # the JIT's launch
        call(4, 256)
        call(7, 256)
        assert len(kernels) == 1 and len(kernels[0].run.calls) == 3      # bound, no dispatch
        jit_call, bound_call, other_rows = kernels[0].run.calls
        # grid x3, stream, function, packed metadata | metadata, hooks | the kernel's args
        assert bound_call[:6] == jit_call[:6] == (4, 1, 1, STREAM, kernels[0].function,
                                                  kernels[0].packed_metadata)
        assert bound_call[6:9] == (None, None, None)
        assert len(bound_call[9:]) == len(jit_call[9:]) == len(_fused_norm_kernel.arg_names)
        for name, a, b in zip(_fused_norm_kernel.arg_names, bound_call[9:], jit_call[9:],
                              strict=True):
            if isinstance(a, torch.Tensor):
                assert a.shape == b.shape and a.dtype == b.dtype, name
            else:
                assert a == b, name
        call(4, 512)
        call(4, 256, offset=1)
        assert len(kernels) == 3                   # two more specialisations, each compiled once
    _BOUND.clear()


def test_the_auto_grid_takes_the_groups_smallest_gpu(monkeypatch):
    """`fit_to_device` caps `max_ctas` at the smallest SM count of the group (a MIN all-reduce:
    ranks that lowered different grids would disagree on their barrier counts and hang), and
    leaves a smaller cap alone."""
    import torch.distributed as dist

    from hiercoll.executor.cuda import backend
    from hiercoll.executor.cuda.lowering import CudaOptions

    class Props:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())

    def smallest_elsewhere(t, op, group=None):  # another rank has an H100 PCIe's 114 SMs
        assert op == dist.ReduceOp.MIN
        t.fill_(min(int(t.item()), 114))
    monkeypatch.setattr(dist, "all_reduce", smallest_elsewhere)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    cpu = torch.device("cpu")
    assert backend.fit_to_device(CudaOptions(), cpu).max_ctas == 114
    assert backend.fit_to_device(CudaOptions(max_ctas=64), cpu).max_ctas == 64


def test_a_sweep_knob_takes_a_positive_integer_or_says_which_variable_is_wrong(monkeypatch):
    from hiercoll.kernels.abi import sweep_knob
    monkeypatch.delenv("HIERCOLL_TEST_KNOB", raising=False)
    assert sweep_knob("HIERCOLL_TEST_KNOB", 8) == 8
    monkeypatch.setenv("HIERCOLL_TEST_KNOB", " 16 ")
    assert sweep_knob("HIERCOLL_TEST_KNOB", 8) == 16
    for bad in ("sixteen", "0", "-4"):
        monkeypatch.setenv("HIERCOLL_TEST_KNOB", bad)
        with pytest.raises(ValueError, match="HIERCOLL_TEST_KNOB.*positive integer"):
            sweep_knob("HIERCOLL_TEST_KNOB", 8)
