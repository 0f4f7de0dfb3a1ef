"""The fused all-reduce + residual add + RMSNorm: its protocol on the weak-memory emulator (and the
negatives: no release, no acquire, polling-thread-only acquire each give stale reads), the
kernel's numbers in Triton's CPU interpreter, its PTX ordering (present, and absent when the
switches are off), the stage-choice model, the CLI on gloo, and GPU runs (skipped on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import compile_sm90_ptx

from hiercoll.cli.main import main
from hiercoll.executor.cuda.fused_emulate import FusedCall, emulate, reference, stale_calls
from hiercoll.kernels.fused_norm_abi import Ordering, cta_active, cta_rows, owner_rows, slot
from hiercoll.sim.fused_norm_cost import CALIBRATED, FusedNormCosts, choose_stage, costs_for, fit

NEGATIVES = {"no release": Ordering(release=False), "no acquire": Ordering(acquire=False),
             "polling thread only": Ordering(acquire_all_threads=False)}


def _calls(world: int, rows: int | tuple[int, ...], hidden: int, n: int, seed: int,
           stages: tuple[int, ...]) -> list[FusedCall]:
    """n calls; `rows` a tuple: call k has rows[k % len(rows)] rows (shapes change between
    calls, so CTAs go idle and come back)."""
    g = np.random.default_rng(seed)
    ms = rows if isinstance(rows, tuple) else (rows,)
    return [FusedCall([g.standard_normal((ms[k % len(ms)], hidden)) for _ in range(world)],
                      g.standard_normal((ms[k % len(ms)], hidden)), g.random(hidden) + 0.5,
                      stages[k % len(stages)]) for k in range(n)]


# ---- layout ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("rows", "world", "grid"), [(1, 4, 16), (7, 3, 2), (1319, 8, 16), (5, 2, 4)])
def test_every_row_is_reduced_once_per_owner_and_slots_are_distinct(rows, world, grid):
    for stages in (1, 2):
        for owner in range(world if stages == 2 else 1):
            covered = [r for c in range(grid)
                       for r in range(*cta_rows(rows, world, grid, stages, owner, c))]
            lo, hi = owner_rows(rows, world, owner) if stages == 2 else (0, rows)
            assert covered == list(range(lo, hi))
    slots = {slot(p, ph, c, s, grid, world) for p in (0, 1) for ph in (0, 1)
             for c in range(grid) for s in range(world)}
    assert len(slots) == 2 * 2 * grid * world


# ---- the protocol on the weak-memory emulator ----------------------------------------------------
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("stages", [(1,), (2,), (1, 2, 2, 1), (3,), (3, 1, 3, 2, 3)])
@pytest.mark.parametrize("loads", ["oldest", "newest"])
def test_the_protocol_is_right_on_the_weak_memory_emulator(world, stages, loads):
    seed = int(np.random.default_rng().integers(1 << 30))     # fresh inputs and schedules
    for s in range(3):
        calls = _calls(world, 5, 4, 6, seed + s, stages)
        assert stale_calls(world, calls, Ordering(), seed=seed + s, loads=loads) == [], \
            f"seed {seed + s}"


@pytest.mark.parametrize("stages", [(1,), (2,), (1, 2, 2)])
def test_idle_ctas_sitting_calls_out_keep_the_protocol_right(stages):
    """Grid 4 and calls of 1..5 rows: CTAs without rows skip a call (only their counter moves)
    and take part again later with the same slots; results stay exact, and the negatives are
    still caught."""
    seed = int(np.random.default_rng().integers(1 << 30))
    for world in (2, 3, 4):
        calls = _calls(world, (1, 5, 2, 3, 1), 4, 7, seed, stages)
        for loads in ("oldest", "newest"):
            assert stale_calls(world, calls, Ordering(), grid=4, seed=seed, loads=loads) == [], \
                f"world {world}, seed {seed}"
        assert stale_calls(world, calls, Ordering(release=False), grid=4, seed=seed), \
            f"world {world}, seed {seed}: no release was not caught"


def test_cta_zero_and_ctas_with_rows_take_part():
    assert [cta_active(1, 4, 16, 1, c) for c in range(16)] == [True] + [False] * 14 + [True]
    assert [cta_active(0, 4, 4, 2, c) for c in range(4)] == [True, False, False, False]
    # 2-stage: a CTA with rows on any owner takes part on every rank
    for rows, world, grid in ((5, 4, 8), (9, 3, 4), (40, 4, 16)):
        for c in range(grid):
            some = any(cta_rows(rows, world, grid, 2, q, c)[1] > cta_rows(rows, world, grid, 2, q, c)[0]
                       for q in range(world))
            assert cta_active(rows, world, grid, 2, c) == (some or c == 0)


def test_one_stage_needs_two_staging_halves_on_the_emulator():
    """With one half, a rank's next call overwrites rows a slow peer has not read yet (seen when
    loads may return the newest value); the 2-stage kernel's second barrier alone prevents it."""
    seed = int(np.random.default_rng().integers(1 << 30))
    found = [s for s in range(seed, seed + 10)
             if stale_calls(4, _calls(4, 5, 4, 6, s, (1,)), Ordering(), seed=s, loads="newest",
                            double_buffer=False)]
    assert found, f"seeds {seed}..{seed + 9}: the emulator missed the overwrite"
    for s in range(seed, seed + 3):
        assert stale_calls(4, _calls(4, 5, 4, 6, s, (2,)), Ordering(), seed=s, loads="newest",
                           double_buffer=False) == []


def test_the_ll_form_needs_two_parities_on_the_emulator():
    """LL calls (stage 3), one parity for every call: a rank's next call overwrites words a slow
    peer has not read, whose poll then never sees its call number: the emulator finds the
    deadlock; with the kernel's two parities, every call is right, idle CTAs included."""
    seed = int(np.random.default_rng().integers(1 << 30))
    stuck = []
    for s in range(seed, seed + 10):
        try:
            emulate(2, _calls(2, 5, 4, 6, s, (3,)), seed=s, double_buffer=False)
        except RuntimeError as err:
            assert "deadlocks" in str(err)
            stuck.append(s)
    assert stuck, f"seeds {seed}..{seed + 9}: the emulator missed the overwrite"
    for world in (2, 3, 4):
        calls = _calls(world, (1, 5, 2, 3, 1), 4, 7, seed, (3,))
        assert stale_calls(world, calls, Ordering(), grid=4, seed=seed) == [], f"seed {seed}"


@pytest.mark.parametrize("name", list(NEGATIVES))
@pytest.mark.parametrize("stages", [(1,), (2,)])
def test_dropping_an_ordering_gives_stale_reads_on_the_emulator(name, stages):
    seed = int(np.random.default_rng().integers(1 << 30))
    for world in (2, 4):
        calls = _calls(world, 5, 4, 4, seed, stages)
        assert stale_calls(world, calls, NEGATIVES[name], seed=seed), \
            f"{name}, world {world}, seed {seed}: the emulator missed it"


def test_emulated_outputs_are_the_reference_on_every_rank():
    calls = _calls(3, 4, 5, 3, 7, (2,))
    outs = emulate(3, calls, seed=1)
    for call, per_rank in zip(calls, outs, strict=True):
        want_n, want_r = reference(call, 1e-6)
        for got_n, got_r in per_rank:
            np.testing.assert_allclose(got_n, want_n, rtol=1e-12)
            np.testing.assert_allclose(got_r, want_r, rtol=1e-12)


# ---- stage choice --------------------------------------------------------------------------------
def test_stage_choice_is_one_stage_small_two_stage_large():
    one_gpu = CALIBRATED       # the one-GPU fit: no unfused line, so never the fallback
    assert choose_stage(1, 4096, 4, 2, one_gpu) == 1
    assert choose_stage(16384, 4096, 4, 2, one_gpu) == 2
    assert choose_stage(16384, 4096, 1, 2) == 1
    picks = [choose_stage(m, 2880, 4, 2, one_gpu) for m in (1, 2, 4, 8, 16, 64, 128, 512, 1024, 4096)]
    assert picks == sorted(picks)          # one crossover, 1 below it and 2 above


def test_the_shipped_multi_gpu_fits_fuse_small_calls_and_fall_back_where_fusion_lost():
    """4 x H200: the fused kernel for decode shapes, NCCL + add + norm from ~1 MB (where the
    measured fused stages were slower); 2 x H200: fused at every measured shape (1-stage for
    decode shapes, 2-stage for the largest, where its smaller volume term wins)."""
    assert [choose_stage(m, 4096, 4, 2) for m in (1, 16, 64)] == [1, 1, 1]
    assert choose_stage(16384, 4096, 4, 2) == 0
    assert [choose_stage(m, 2880, 2, 2) for m in (1, 16, 512, 1319, 2048)] == [1, 1, 1, 1, 1]
    assert choose_stage(16384, 4096, 2, 2) == 2
    assert choose_stage(32768, 4096, 2, 2) == 0         # above what the 2-GPU run measured
    for world in (2, 4):
        assert "H200" in costs_for(world).source and costs_for(world).measured_up_to
    # with the LL form where it runs (decode shapes): LL, then 1-stage past the LL area
    from hiercoll.executor.cuda.fused_norm import stage_choice
    for world in (2, 4):
        assert [stage_choice(m, h, world, 2) for h in (2880, 4096) for m in (1, 16)] == [3] * 4
        assert stage_choice(64, 4096, world, 2) == 1


def test_the_unfused_fallback_is_picked_only_where_the_model_says_fusion_loses():
    # fused lines that lose to a fitted unfused line above ~1 MB, and win below
    c = FusedNormCosts(10.0, 30.0, 15.0, 40.0, "synthetic", a0_us=20.0, b0_us_per_mb=20.0)
    picks = [choose_stage(m, 4096, 4, 2, c) for m in (1, 4, 16, 64, 512, 4096)]
    assert picks[0] == 1 and picks[-1] == 0
    assert all(p == 0 for p in picks[picks.index(0):])     # once unfused wins, it keeps winning
    # without unfused rows the fit never falls back
    rows = [(s, n, 4, c.predict_us(s, n, 4)) for s in (1, 2) for n in (8192, 1 << 20, 8 << 20)]
    assert fit(rows, "t").a0_us == float("inf")
    assert choose_stage(16384, 4096, 4, 2, fit(rows, "t")) in (1, 2)
    with_unfused = fit(rows + [(0, n, 4, c.unfused_us(n, 4)) for n in (8192, 1 << 20, 8 << 20)],
                       "t")
    assert abs(with_unfused.a0_us - 20.0) < 1e-6 and abs(with_unfused.b0_us_per_mb - 20.0) < 1e-6


def test_the_ll_form_is_picked_only_where_it_runs_and_was_fitted():
    """The LL form (stage 3) competes only where the kernels' rule says it can run the call
    (`ll=`), and only with a fitted line (unmeasured: a3 = inf); its stage number is the
    kernels' (the simulator may not import them)."""
    from hiercoll.executor.cuda.fused_norm import stage_choice
    from hiercoll.kernels.fused_norm_abi import LL_STAGE as ABI_LL_STAGE
    from hiercoll.kernels.fused_norm_abi import ll_applies
    from hiercoll.sim.fused_norm_cost import LL_STAGE
    assert LL_STAGE == ABI_LL_STAGE == 3
    c = FusedNormCosts(10.0, 3.0, 15.0, 4.0, "synthetic", a3_us=6.0, b3_us_per_mb=6.0)
    assert choose_stage(1, 4096, 4, 2, c, ll=True) == LL_STAGE
    assert choose_stage(1, 4096, 4, 2, c, ll=False) == 1
    assert choose_stage(1, 4096, 4, 2, FusedNormCosts(10.0, 3.0, 15.0, 4.0, "x"), ll=True) == 1
    assert ll_applies(16, 4096, 2) and ll_applies(45, 2880, 2)
    assert not ll_applies(64, 4096, 2) and not ll_applies(1, 4095, 2) and not ll_applies(1, 4096, 4)
    assert stage_choice(16, 4096, 4, 2, c) == LL_STAGE and stage_choice(64, 4096, 4, 2, c) != 3
    rows = [(s, n, 4, c.predict_us(s, n, 4)) for s in (1, 2, LL_STAGE)
            for n in (8192, 65536, 262144)]
    got = fit(rows, "t")
    assert abs(got.a3_us - 6.0) < 1e-6 and abs(got.b3_us_per_mb - 6.0) < 1e-6
    assert fit([r for r in rows if r[0] != LL_STAGE], "t").a3_us == float("inf")


def test_the_fit_recovers_known_constants():
    true = FusedNormCosts(12.0, 8.0, 20.0, 6.0, "synthetic")
    sizes = [8192, 65536, 1 << 20, 8 << 20, 64 << 20]
    rows = [(s, n, 4, true.predict_us(s, n, 4)) for s in (1, 2) for n in sizes]
    got = fit(rows, "test")
    for a, b in ((got.a1_us, 12.0), (got.b1_us_per_mb, 8.0), (got.a2_us, 20.0),
                 (got.b2_us_per_mb, 6.0)):
        assert abs(a - b) < 1e-6 * max(1.0, b)
    assert "H200" in CALIBRATED.source      # the shipped constants say where they came from


def test_bad_arguments_are_one_line_errors_before_any_launch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from hiercoll.errors import HiercollError
    from hiercoll.executor.cuda.fused_norm import GroupContext, fused_add_rms_norm
    ctx = GroupContext(0, 2, None, torch.device("cpu"))
    x = torch.zeros(3, 8, dtype=torch.bfloat16)
    w = torch.ones(8, dtype=torch.bfloat16)
    for args, match in [((x, x[:2], w, 1e-6), "residual must have x's shape"),
                        ((x, x, w[:4], 1e-6), "weight must be [8]"),
                        ((x.view(-1), x.view(-1), w, 1e-6), "x must be [rows, hidden]"),
                        ((x, x, w, 0.0), "eps 0.0 must be > 0"),
                        ((x.int(), x.int(), w, 1e-6), "is not supported")]:
        with pytest.raises(HiercollError, match=match.replace("[", r"\[").replace("]", r"\]")):
            fused_add_rms_norm(ctx, *args)
    with pytest.raises(HiercollError, match=r"stage 4 must be 1, 2, 3 \(LL\), 0 \(unfused\)"):
        fused_add_rms_norm(ctx, x, x, w, 1e-6, stage=4)
    wide = torch.zeros(64, 4096, dtype=torch.bfloat16)       # past the LL area
    with pytest.raises(HiercollError, match=r"stage 3 \(LL\) runs bf16/fp16 with an even hidden "
                       r"and at most 32 rows of 4096; got \[64, 4096\]"):
        fused_add_rms_norm(ctx, wide, wide, torch.ones(4096, dtype=torch.bfloat16), 1e-6, stage=3)


# ---- PTX: the ordering is in the generated code, and goes when switched off ----------------------
def _ordered_ops(ptx: str, sem: str) -> list[str]:
    """System-scope PTX instructions carrying `sem` (how test_exec_kernels reads them)."""
    found = []
    for line in ptx.splitlines():
        words = line.strip().split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            quals = words[0].split(".")
            if quals[0] in ("atom", "red", "ld", "st") and sem in quals and "sys" in quals:
                found.append(words[0])
    return found


def _ptx(stages: int, ordering: Ordering, ptx: bool = False) -> str:
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    from triton.compiler import ASTSource

    from hiercoll.kernels.fused_norm import _fused_norm_kernel
    ptrs = ["x_ptr", "res_ptr", "w_ptr", "out_ptr", "res_out_ptr", "buf_ptr"]
    sig = {k: "*bf16" for k in ptrs} | {
        "buf_deltas": "*i64", "sig_ptr": "*i32", "sig_deltas": "*i64", "epoch_ptr": "*i32",
        "err_ptr": "*i64", "ll_ptr": "*i64", "ll_deltas": "*i64", "rank": "i32", "rows": "i32",
        "H": "i32", "stride": "i64", "eps": "fp32", "spin_limit": "i32", "ll_words": "i32"}
    consts = {"W": 4, "G": 16, "STAGES": stages, "BLOCK_H": 4096, "LANES": 256,
              "RELEASE": ordering.release, "ACQUIRE": ordering.acquire,
              "ACQUIRE_ALL_THREADS": ordering.acquire_all_threads, "FIRST_PART": 0,
              "LAST_PART": 2, "WP": 4, "PTX": ptx, "RB": 2, "RBG": 4, "FMT": 1}
    sig |= {k: "constexpr" for k in consts}
    src = ASTSource(fn=_fused_norm_kernel, signature=sig, constexprs=consts,
                    attrs={(k,): [["tt.divisibility", 16]] for k in range(13)})
    return compile_sm90_ptx(src, 8)


@pytest.mark.parametrize("stages", [1, 2])
def test_portable_atomics_have_system_scope_release_and_every_thread_acquire(stages):
    """HIP and the interpreter's path (PTX off): acquire/release atomics."""
    ptx = _ptx(stages, Ordering())
    releases = _ordered_ops(ptx, "release")
    acquires = _ordered_ops(ptx, "acquire")
    assert releases and all(op.split(".")[0] in ("atom", "red") for op in releases)
    assert acquires
    assert "bar.sync" in ptx
    no_rel = _ptx(stages, Ordering(release=False))
    assert _ordered_ops(no_rel, "release") == [] and _ordered_ops(no_rel, "acquire")
    assert _ordered_ops(_ptx(stages, Ordering(acquire=False)), "acquire") == []
    polling_only = _ordered_ops(_ptx(stages, Ordering(acquire_all_threads=False)), "acquire")
    assert 0 < len(polling_only) < len(acquires)     # the per-thread acquires are what went


def _fences(ptx: str) -> int:
    return sum(line.strip().startswith("fence.acq_rel.sys") for line in ptx.splitlines())


@pytest.mark.parametrize("stages", [1, 2])
def test_cuda_path_releases_fire_and_forget_and_every_thread_fences(stages):
    """CUDA (PTX on): `red.release.sys` signals after a CTA barrier, relaxed system-scope polls
    and a `fence.acq_rel.sys` per wait in every thread; each switch removes its part."""
    ptx = _ptx(stages, Ordering(), ptx=True)
    releases = _ordered_ops(ptx, "release")
    assert releases and all(op.startswith("red.release.sys") for op in releases)
    assert _ordered_ops(ptx, "relaxed") and "bar.sync" in ptx
    assert _fences(ptx) >= stages and _ordered_ops(ptx, "acquire") == []
    no_rel = _ptx(stages, Ordering(release=False), ptx=True)
    assert _ordered_ops(no_rel, "release") == [] and _fences(no_rel) == _fences(ptx)
    no_acq = _ptx(stages, Ordering(acquire=False), ptx=True)
    assert _fences(no_acq) == 0 and _ordered_ops(no_acq, "acquire") == []
    polling_only = _ptx(stages, Ordering(acquire_all_threads=False), ptx=True)
    assert _fences(polling_only) == 0 and _ordered_ops(polling_only, "acquire")


def test_the_ll_form_stores_and_polls_flagged_words_with_no_release_acquire_or_fence():
    """CUDA, stage 3 (LL): 8-byte relaxed system-scope stores into the peers' areas and relaxed
    system-scope loads of its own (the word checked is the data used); no release, no acquire,
    no fence: the ordering the 1-/2-stage kernels need has nothing to order here."""
    ptx = _ptx(3, Ordering(), ptx=True)
    assert "st.relaxed.sys.global.b64" in ptx and "ld.relaxed.sys.global.b64" in ptx
    assert _ordered_ops(ptx, "release") == [] and _ordered_ops(ptx, "acquire") == []
    assert _fences(ptx) == 0


# ---- the kernel's numbers in Triton's CPU interpreter --------------------------------------------
_INTERPRET = r'''
import json, sys
import torch
import triton.runtime.interpreter as _interp

_orig_patch = _interp._patch_lang_tensor


def _patch(tensor, scope):   # triton 3.6's interpreter calls int() on 1-element arrays (numpy 2.4)
    _orig_patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


_interp._patch_lang_tensor = _patch
from hiercoll.executor.cuda.fused_norm import OneGpuFusedNorm
from hiercoll.torch.reference import unfused_add_rms_norm as reference

W, M, H = 3, 7, 40
out = {"err": [], "identical": True}
for dtype in (torch.bfloat16, torch.float32):
    c = OneGpuFusedNorm(W, M, H, dtype, torch.device("cpu"), grid=3)
    g = torch.Generator().manual_seed(int(sys.argv[1]))
    cases = ((1, M), (2, 1), (2, M), (1, 1))      # 1 row: CTA 1 sits the call out
    if dtype == torch.bfloat16:                   # the LL form (16-bit words), between the others
        cases = ((3, M),) + cases[:2] + ((3, 1),) + cases[2:] + ((3, M),)
    for stages, m in cases:
        xs = [torch.randn(m, H, generator=g).to(dtype) for _ in range(W)]
        res = torch.randn(m, H, generator=g).to(dtype)
        w = (torch.rand(H, generator=g) + 0.5).to(dtype)
        outs = [torch.full((m, H), float("nan"), dtype=dtype) for _ in range(W)]
        routs = [torch.full((m, H), float("nan"), dtype=dtype) for _ in range(W)]
        c.run_parts(xs, [res] * W, w, 1e-6, outs, routs, stages)
        n, r = reference(xs, res, w, 1e-6)
        err = max(float((o.float() - n.float()).abs().max()) for o in outs)
        err = max([err] + [float((o.float() - r.float()).abs().max()) for o in routs])
        out["err"].append([str(dtype), stages, err])
        out["identical"] &= all(torch.equal(outs[0], o) and torch.equal(routs[0], q)
                                for o, q in zip(outs, routs))
    out.setdefault("epochs", []).append([s.epoch.tolist() for s in c.states])
print(json.dumps(out))
'''


def test_kernel_numbers_in_the_triton_interpreter():
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    seed = str(int(np.random.default_rng().integers(1 << 30)))
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _INTERPRET, seed], capture_output=True,
                          text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for dtype, _, err in out["err"]:     # bf16: a rounding of O(4) values; fp32: ~1e-6
        assert err <= (0.07 if "bfloat16" in dtype else 1e-4), (seed, out["err"])
    assert out["identical"]
    # every CTA counted every call, idle or not (bf16: three LL calls more)
    assert out["epochs"] == [[[7, 7, 7]] * 3, [[4, 4, 4]] * 3]


# ---- the CLI (gloo: the unfused fallback through the same harness) --------------------------------
@pytest.mark.parametrize(("argv", "match"), [
    (["stress", "--fused-rmsnorm", "--shapes", "0"], "--shapes: 0 rows"),
    (["stress", "--fused-rmsnorm", "--hidden", "99999"], "--hidden: 99999 must be in"),
    (["stress", "--fused-rmsnorm", "-c", "all_reduce"], "takes no plan file or --collective"),
    (["stress", "--fused-rmsnorm", "--dtype", "fp32"], "--dtype: --fused-rmsnorm runs bf16"),
    (["stress", "--fused-rmsnorm", "--one-gpu"], "--one-gpu: needs --backend cuda"),
    (["stress", "--fused-rmsnorm", "--backend", "gloo", "--modes", "graph"],
     "--modes graph: needs --backend cuda"),
    (["stress", "--fused-rmsnorm", "--backend", "nccl"], "--backend cuda"),
    (["stress", "--fused-rmsnorm", "--stage", "3", "--shapes", "1,64", "--hidden", "4096"],
     "elements a call; 64x4096 do not fit: pass --shapes within it"),
])
def test_fused_stress_argument_errors_are_one_line(argv, match, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and match in err and err.count("\n") == 1, err


def test_fused_stress_on_gloo_under_torchrun(tmp_path):
    out = tmp_path / "fused.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "-m", "hiercoll", "stress", "--fused-rmsnorm",
                           "--backend", "gloo", "--iters", "2", "--shapes", "1,3",
                           "--hidden", "8,40", "--world", "2", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == 4 and all(c["ok"] and c["iterations"] == 2 for c in cases)
    assert {c["path"] for c in cases} == {"gloo"} and max(c["max_abs_error"] for c in cases) <= 0.5


# ---- GPU (skipped on CPU machines) ---------------------------------------------------------------
def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_one_gpu_fused_stress(stage, mode):
    from hiercoll.harness.fused_norm_stress import stress_one_gpu
    from hiercoll.torch.reference import unfused_add_rms_norm
    for rows in (1, 1319):
        r = stress_one_gpu(unfused_add_rms_norm, 4, rows, 2880, 50, mode, stage=stage, spin_limit=2_000_000,
                           seed=int(np.random.default_rng().integers(1 << 30)))
        assert r.ok, r.to_json()


def test_the_stress_compares_ranks_in_a_dtype_nccl_moves():
    """The first multi-GPU run died at once: the rank-identical check broadcast an int16 view,
    which NCCL refuses ("Short"). The bits now travel as uint8, NaN and -0.0 kept apart."""
    torch = pytest.importorskip("torch")
    from hiercoll.harness.fused_norm_stress import NCCL_DTYPES, comparison_bits
    a = torch.tensor([1.0, float("nan"), -0.0], dtype=torch.bfloat16)
    b = torch.tensor([[0.0, 2.5]], dtype=torch.bfloat16)
    bits = comparison_bits(a, b)
    assert bits.dtype in NCCL_DTYPES and bits.numel() == 2 * 5
    assert torch.equal(comparison_bits(a, b), bits)
    assert not torch.equal(comparison_bits(a.abs(), b), bits)        # -0.0 is not +0.0


def test_large_shapes_take_large_iters_and_drops_name_one_rule():
    """The seed's regression: --iters up to 4.7 MB of bf16, --large-iters above (never more
    than --iters); each --drop-ordering removes exactly its rule."""
    import argparse

    from hiercoll.cli.fused_norm_cmd import DROPS, _ordering, iterations
    args = argparse.Namespace(iters=2000, large_iters=200, drop_ordering=None)
    assert iterations(args, 512, 4096) == 2000            # 4.2 MB
    assert iterations(args, 1024, 4096) == 200            # 8.4 MB
    assert iterations(argparse.Namespace(iters=50, large_iters=200), 16384, 4096) == 50
    assert _ordering(args) == Ordering()
    for name, off in DROPS.items():
        got = _ordering(argparse.Namespace(drop_ordering=name))
        assert [k for k in ("release", "acquire", "acquire_all_threads")
                if getattr(got, k) is False] == list(off), name
