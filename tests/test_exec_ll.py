"""The LL lowering (ll_protocol.py) and its kernel (kernels/ll.py) on CPU: which plans take
it, that every rank's program is right over several calls under random interleavings (the
emulator), that the emulator catches the two hazards its rules remove, the kernel's data path in
Triton's interpreter across ranks, and the memory operations the Hopper build uses."""

from __future__ import annotations

import pytest
from helpers import check_emulation, compile_sm90_ptx, random_group_cast, random_group_reduce, run_interpreted

from hiercoll import ll_protocol as ll_mod
from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError, VerificationError
from hiercoll.executor.cuda import emulate as emu
from hiercoll.executor.cuda.lowering import CudaOptions, fused_launch, ll_applies, lower
from hiercoll.executor.cuda.table import encode
from hiercoll.kernels.abi import F_DST, F_LL, ROW_WORDS
from hiercoll.ll_protocol import ll_plan_or_reason
from hiercoll.planner import plan
from hiercoll.topology import preset


def _plan(kind: str, algo: str, count: int = 40, dtype: str = "bf16", world: int = 4):
    size = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}[dtype]
    spec = CollectiveSpec(kind=kind, world_size=world, nbytes=count * world * size, dtype=dtype)
    return plan(preset("h200x4"), spec, algo).expand()


@pytest.mark.parametrize(("kind", "algo", "takes_ll"), [
    ("all_reduce", "direct", True), ("reduce_scatter", "direct", True),
    ("all_gather", "direct", True), ("all_to_all", "direct", True),
    ("all_reduce", "two_shot", True), ("all_reduce", "rd", True), ("all_reduce", "hier", True),
    ("all_gather", "ring", True),       # a received chunk is forwarded from the LL area
    ("all_reduce", "ring", False),      # a scratch slot written twice in a call
    ("all_reduce", "tree", False),      # pulls from a peer
    ("all_reduce", "rhd", False),       # reads half of an earlier result (another CTA's words)
    ("broadcast", "direct", False),     # the root never hears back: barriers stay
])
def test_plans_that_push_each_region_once_take_the_ll_lowering(kind, algo, takes_ll):
    s = _plan(kind, algo)
    for r in range(4):     # plans whose receivers unpack take LL under auto only if asked (below)
        prog = lower(s, r, CudaOptions(ll_unpack_peers=3))
        assert bool(prog.ll_half) is takes_ll
        if takes_ll:
            (launch,) = prog.streams[0]
            assert prog.fused and prog.start_barrier is None and not prog.end_barrier.rows
            assert not any(row.waits or row.signals for row in launch.rows)
            pushes = [row for row in launch.rows if row.ll & 1]
            assert all(row.dst is not None and row.dst.rank != r for row in pushes)
            assert launch.rows[0].ll & 1          # a push first: the bytes leave at once


def test_auto_takes_ll_where_ranks_unpack_from_one_peer():
    """Plans whose receivers unpack pushes into their output: on 4 GPUs direct / two_shot ranks
    unpack from 3 peers and lost to simple, ring all-gather (one neighbour) and every 2-GPU plan
    won with LL (ll_protocol.DEFAULT_LL_UNPACK_PEERS). `ll` still forces any qualifying plan,
    and the knob moves the limit."""
    for kind in ("all_gather", "all_to_all"):
        s = _plan(kind, "direct")
        assert ll_applies(s, CudaOptions()) is None
        assert ll_applies(s, CudaOptions(protocol="ll")) is not None
        assert ll_applies(s, CudaOptions(ll_unpack_peers=3)) is not None
        assert "from 3 peers" in str(ll_plan_or_reason(s, 1 << 20, True, 1))
        two = plan(preset("h200x2"), CollectiveSpec(kind=kind, world_size=2, nbytes=160), "direct")
        assert ll_applies(two.expand(), CudaOptions()) is not None
    assert ll_applies(_plan("all_gather", "ring"), CudaOptions()) is not None      # one neighbour
    assert ll_applies(_plan("all_reduce", "direct"), CudaOptions()) is not None    # no unpacks
    assert ll_applies(_plan("all_reduce", "two_shot"), CudaOptions()) is None      # 3 peers
    with pytest.raises(HiercollError, match="ll_unpack_peers"):
        CudaOptions(ll_unpack_peers=-1)


def test_the_protocol_knobs_decide_and_are_validated():
    s = _plan("all_reduce", "direct", count=16 << 10)       # 128 KiB
    assert ll_applies(s, CudaOptions()) is not None
    assert ll_applies(s, CudaOptions(ll_threshold_bytes=64 << 10)) is None
    assert ll_applies(s, CudaOptions(ll_threshold_bytes=64 << 10, protocol="ll")) is not None
    assert ll_applies(s, CudaOptions(protocol="simple")) is None
    assert ll_applies(s, CudaOptions(fuse=False)) is None            # the multi-launch form
    assert ll_applies(s, CudaOptions(launch_per_op=True, protocol="ll")) is None
    assert ll_applies(_plan("all_reduce", "direct", dtype="fp64"), CudaOptions()) is None
    assert ll_applies(_plan("reduce_scatter", "direct", count=41), CudaOptions()) is None  # odd
    notes = lower(_plan("all_reduce", "tree"), 0, CudaOptions(protocol="ll")).notes
    assert any(n.startswith("--protocol ll not taken (op 0.0 reads a peer") for n in notes)
    with pytest.raises(HiercollError, match="protocol: 'fast' should be one of auto, simple, ll"):
        CudaOptions(protocol="fast")
    with pytest.raises(HiercollError, match="ll_threshold_bytes"):
        CudaOptions(ll_threshold_bytes=-1)


def test_ll_addresses_are_encoded_as_signal_slots_of_the_receiver():
    s = _plan("all_reduce", "direct")
    prog = lower(s, 0, CudaOptions())
    sig_delta = [0, 1000, 2000, 3000]
    words = encode(prog, [0, 10, 20, 30], sig_delta).words
    rows = fused_launch(prog).rows
    for i, row in enumerate(rows):
        assert words[i * ROW_WORDS + F_LL] == row.ll
        if row.ll & 1:
            assert row.dst is not None
            assert words[i * ROW_WORDS + F_DST] == sig_delta[row.dst.rank] + row.dst.offset
    assert prog.num_slots == 2 * prog.ll_half and prog.ll_half == prog.ll_elements  # bf16


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_emulated_ll_programs_are_right_over_several_calls(kind, dtype):
    s = _plan(kind, "direct", dtype=dtype)
    assert ll_applies(s, CudaOptions(protocol="ll")) is not None
    for seed, ctas in enumerate((1, 2, 5)):
        check_emulation(s, CudaOptions(ctas=ctas, protocol="ll"), seed)


def _failures(s, opts, seeds=16, calls=5) -> int:  # type: ignore[no-untyped-def]
    n = 0
    for seed in range(seeds):
        try:
            check_emulation(s, opts, seed, calls=calls)
        except (VerificationError, AssertionError):
            n += 1
    return n


def test_emulator_catches_a_single_buffered_ll_area(monkeypatch):
    """With one copy of the LL area a fast rank's next call overwrites words a slow rank has not
    read yet: the slow rank then waits for an epoch that never comes (or reads the wrong call)."""
    s = _plan("all_reduce", "direct")
    assert _failures(s, CudaOptions(ctas=2), seeds=4) == 0
    monkeypatch.setattr(emu, "LL_PARITIES", 1)
    assert _failures(s, CudaOptions(ctas=2)) > 0


def test_emulator_catches_ll_without_answering_edges(monkeypatch):
    """A broadcast's root hears from nobody, so without barriers it runs two calls ahead and
    overwrites the parity a receiver still reads: why such plans keep the simple lowering."""
    s = _plan("broadcast", "direct")
    assert ll_applies(s, CudaOptions(protocol="ll")) is None
    monkeypatch.setattr(ll_mod, "answered", lambda *args: True)
    s = _plan("broadcast", "direct")        # a new plan: the lowering memoises per plan
    assert ll_applies(s, CudaOptions(protocol="ll")) is not None
    # the root must get two whole calls ahead of a receiver: a random walk needs many calls
    assert _failures(s, CudaOptions(protocol="ll", ctas=1), calls=80) >= 3    # 6 of 16 seeds


# ---- the kernel ------------------------------------------------------------------------------
_INTERPRET = r'''
import json
import numpy as np
import torch
from hiercoll.collectives import CollectiveSpec, random_inputs, initial_outputs, reference, tolerance
from hiercoll.executor.cuda.lowering import CudaOptions, lower, fused_launch
from hiercoll.executor.cuda.table import encode
from hiercoll.executor.cuda.symm import deltas
from hiercoll.executor.cuda.one_gpu import slabs
from hiercoll.executor.torch_dtypes import torch_dtype
from hiercoll.kernels.program import KernelState, launch_rows
from hiercoll.kernels.abi import RowSpan
from hiercoll.planner import plan
from hiercoll.topology import preset
from hiercoll.schedule import INPUT, OUTPUT

def groups(s, prog):
    """A rank's rows cut where the dependency level changes (unpacking last)."""
    from hiercoll.ll_protocol import _dep_levels
    level = _dep_levels(s)
    top = max(level.values()) + 1
    keys = [top if row.op.endswith(":unpack") else level[tuple(map(int, row.op.split(".")))]
            for row in fused_launch(prog).rows]
    out, start = {}, 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            out[keys[start]] = (start, i - start)
            start = i
    return out

def run(kind, dtype, reduce_op, algo="direct", world=4, count=1100, calls=3, grid=2, io="sym"):
    isz = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
    spec = CollectiveSpec(kind=kind, world_size=world, nbytes=count * world * isz, dtype=dtype,
                          reduce_op=reduce_op)
    s = plan(preset("h200x4"), spec, algo).expand()
    progs = [lower(s, r, CudaOptions(ctas=grid, protocol="ll")) for r in range(world)]
    assert all(p.ll_half for p in progs)
    tdt = torch_dtype(spec.dtype)
    data = slabs(world, progs[0].layout.total, tdt, torch.device("cpu"))
    sig = slabs(world, progs[0].num_slots, torch.int32, torch.device("cpu"))
    states, spans = [], []
    for r, p in enumerate(progs):
        t = encode(p, deltas(data[r], r, isz), deltas(sig[r], r, 4))
        states.append(KernelState(torch.tensor(t.words, dtype=torch.int64), data[r].tensor,
                                  sig[r].tensor, torch.zeros(1 + grid, dtype=torch.int32),
                                  torch.zeros(8, dtype=torch.int64), ll_half=p.ll_half,
                                  in_delta=p.layout.offsets[INPUT],
                                  out_delta=p.layout.offsets[OUTPUT]))
        spans.append(t.launches[id(fused_launch(p))])
    rng = np.random.default_rng(7)
    lay = progs[0].layout
    worst, identical = 0.0, True
    cuts = [groups(s, p) for p in progs]
    levels = sorted({k for c in cuts for k in c})
    # io "user": the caller's own input and output tensors (the kernel bases its tagged
    # addresses there); "inplace": one tensor for both (an all-reduce called in place)
    user_in = [torch.zeros(spec.input_count(r) + 7, dtype=tdt)[2:2 + spec.input_count(r)]
               for r in range(world)]
    user_out = ([t[:spec.output_count(r)] for r, t in enumerate(user_in)] if io == "inplace" else
                [torch.zeros(spec.output_count(r), dtype=tdt) for r in range(world)])
    if io != "sym":
        from dataclasses import replace
        isz_b = torch.empty((), dtype=tdt).element_size()
        base = [data[r].tensor.data_ptr() for r in range(world)]
        states = [replace(st, in_delta=(user_in[r].data_ptr() - base[r]) // isz_b,
                          out_delta=(user_out[r].data_ptr() - base[r]) // isz_b)
                  for r, st in enumerate(states)]
    for c in range(calls):
        ins, before = random_inputs(spec, rng), initial_outputs(spec, rng)
        for r in range(world):
            n = spec.input_count(r)
            x = torch.from_numpy(np.asarray(ins[r], dtype=np.float32)).to(tdt)
            if io == "sym":
                data[r].tensor[lay.offsets[INPUT]:lay.offsets[INPUT] + n] = x
            else:
                user_in[r].copy_(x)
        # the interpreter runs one launch at a time: every rank's rows of one dependency level
        # run before any rank's next level, each in a launch whose epoch is taken back but the
        # rank's last
        for lv in levels:
            for r in range(world):
                if lv not in cuts[r]:
                    continue
                first, n = cuts[r][lv]
                sp = spans[r]
                saved = states[r].epoch.clone()
                launch_rows(states[r], RowSpan(sp.first_row + first, n, sp.grid, sp.aligned),
                            reduce_op=reduce_op)
                if lv != max(cuts[r]):
                    states[r].epoch.copy_(saved)
        exp = reference(spec, ins, before)
        outs = ([data[r].tensor[lay.offsets[OUTPUT]:lay.offsets[OUTPUT] + spec.output_count(r)]
                 for r in range(world)] if io == "sym" else [t.clone() for t in user_out])
        for r in range(world):
            err = np.abs(outs[r].double().numpy() - exp.outputs[r])
            assert np.all(err <= tolerance(spec, exp, r)), (kind, dtype, c, r, float(err.max()))
            worst = max(worst, float(err.max()))
        if kind == "all_reduce":
            identical &= all(torch.equal(outs[0], o) for o in outs)
    return {"worst": worst, "epochs": [int(x) for x in states[0].epoch], "identical": identical}

out = {}
for kind, dtype, op, algo in (
        ("all_reduce", "bf16", "sum", "direct"), ("all_reduce", "fp32", "max", "direct"),
        ("all_reduce", "fp16", "avg", "direct"), ("reduce_scatter", "bf16", "sum", "direct"),
        ("all_gather", "fp16", "sum", "direct"), ("all_to_all", "fp32", "sum", "direct"),
        ("all_reduce", "bf16", "sum", "two_shot"), ("all_reduce", "fp32", "sum", "rd"),
        ("all_gather", "bf16", "sum", "ring")):
    out[f"{kind}-{dtype}-{op}-{algo}"] = run(kind, dtype, op, algo)
for kind, algo, io in (("all_reduce", "two_shot", "user"), ("all_reduce", "direct", "inplace"),
                       ("all_reduce", "two_shot", "inplace"), ("all_gather", "direct", "user")):
    out[f"{kind}-{algo}-{io}"] = run(kind, "bf16", "sum", algo, io=io)
print(json.dumps(out))
'''


def test_ll_kernel_data_path_across_ranks_in_the_triton_interpreter():
    """One- and multi-hop plans (two_shot and rd push what they reduced; ring forwards what it
    received), fp32/bf16/fp16, sum/max/avg, two CTAs, three calls; and on a caller's own
    tensors (the tagged input/output addresses based elsewhere), in place for the all-reduce."""
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    out = run_interpreted(_INTERPRET)
    assert len(out) == 13
    for case in out.values():
        assert case["epochs"] == [0, 3, 3]        # each CTA counts its own calls
        assert case["identical"]
    assert out["all_gather-fp16-sum-direct"]["worst"] == 0.0
    assert out["all_to_all-fp32-sum-direct"]["worst"] == 0.0
    assert out["all_gather-bf16-sum-ring"]["worst"] == 0.0
    assert out["all_reduce-fp32-max-direct"]["worst"] == 0.0


def test_ll_kernel_uses_relaxed_system_scope_words_and_no_fence():
    """The protocol's whole ordering is the 8-byte word: a push is a relaxed system-scope 64-bit
    store, a read a relaxed system-scope 64-bit load; no release, acquire or fence anywhere."""
    pytest.importorskip("triton")
    from triton.compiler import ASTSource

    from hiercoll.kernels.ll import ll_kernel
    sig = {"table": "*i64", "data": "*bf16", "sig": "*i32", "epoch_ptr": "*i32",
           "err_ptr": "*i64", "first_row": "i32", "num_rows": "i32", "spin_limit": "i32",
           "ll_half": "i32", "in_delta": "i64", "out_delta": "i64", "REDUCE": "constexpr",
           "FMT": "constexpr", "EPW": "constexpr",
           "BLOCKW": "constexpr", "NS": "constexpr", "PTX": "constexpr"}
    consts = {"REDUCE": 0, "FMT": 1, "EPW": 2, "BLOCKW": 512, "NS": 8, "PTX": True}
    attrs = {(k,): [["tt.divisibility", 16]] for k in range(5)}
    src = ASTSource(fn=ll_kernel, signature=sig, constexprs=consts, attrs=attrs)
    ptx = compile_sm90_ptx(src, 8)
    assert "st.relaxed.sys.global.b64" in ptx and "ld.relaxed.sys.global.b64" in ptx
    for word in ("fence", "membar", ".release", ".acquire"):
        assert word not in ptx, word


def test_the_per_call_bases_are_64_bit_whatever_the_first_call_passed():
    """A caller's tensor lies anywhere: its base from the data allocation does not fit 32 bits.
    Triton types an unannotated int by its first value, and the binary compiled at warm-up (the
    symmetric buffers' small offsets) then refused the first zero-copy call (the 2-GPU stress:
    "signed integer is greater than maximum")."""
    pytest.importorskip("triton")
    from hiercoll.kernels.ll import ll_kernel
    kinds = {p.name: p.annotation_type for p in ll_kernel.params}
    assert kinds["in_delta"] == kinds["out_delta"] == "i64"


def test_group_casts_take_ll_only_where_every_push_is_answered():
    """Irregular group_casts (fp32: every split is whole words): a rank that sends to a peer it
    never receives from keeps the barriers; where every edge is answered the LL program is right
    in the emulator. group_reduce plans stage partial sums or pull, and keep the simple lowering."""
    topo = preset("h200x4")
    taken = 0
    for seed in range(4):
        for kind, gen in (("group_cast", random_group_cast), ("group_reduce", random_group_reduce)):
            spec = CollectiveSpec(kind=kind, world_size=4, dtype="fp32",
                                  splits=gen(4, seed, max_size=8))
            for algo in ("direct", "hier"):
                s = plan(topo, spec, algo).expand()
                why = ll_mod.ll_plan_or_reason(s, 1 << 20)
                if isinstance(why, ll_mod.LLPlan):
                    assert kind == "group_cast"
                    taken += 1
                    check_emulation(s, CudaOptions(ctas=2, protocol="ll"), seed, calls=4)
                else:
                    assert "never hears from" in why or kind == "group_reduce", why
    assert taken >= 2


# ---- the runtime's zero-copy decision and the LL timeout report (no GPU: fake prepared state) -
def _fake_prepared(ll_half: int = 8, in_place: bool = True, n: int = 64):  # type: ignore[no-untyped-def]
    import types

    import torch

    from hiercoll.executor.cuda.backend import CallFacts
    data = torch.zeros(4 * n, dtype=torch.bfloat16)
    program = types.SimpleNamespace(ll_half=ll_half, ll_in_place=in_place)
    views = data[:n], data[n:2 * n]
    facts = CallFacts(n, n, data.dtype, views[0].data_ptr(), views[1].data_ptr(), data.data_ptr())
    return types.SimpleNamespace(program=program, input_view=views[0], output_view=views[1],
                                 kernel=types.SimpleNamespace(data=data), facts=facts), data


def test_zero_copy_runs_an_ll_program_on_the_callers_tensors_only_where_it_may():
    import torch

    from hiercoll.executor.cuda.backend import zero_copy_io
    prepared, data = _fake_prepared()
    mine = torch.zeros(256, dtype=torch.bfloat16)
    x, y = mine[:64], mine[128:192]
    isz = 2
    want = ((x.data_ptr() - data.data_ptr()) // isz, (y.data_ptr() - data.data_ptr()) // isz)
    assert zero_copy_io(prepared, x, y) == want
    assert zero_copy_io(prepared, x, x) == (want[0], want[0])            # in place: plan allows
    assert zero_copy_io(prepared, prepared.input_view, prepared.output_view) is None  # already
    assert zero_copy_io(prepared, mine[1:65], y) is None                  # a word would straddle
    assert zero_copy_io(prepared, x, mine[32:96]) is None                 # overlap, not in place
    unsafe, _ = _fake_prepared(in_place=False)
    assert zero_copy_io(unsafe, x, x) is None
    simple, _ = _fake_prepared(ll_half=0)
    assert zero_copy_io(simple, x, y) is None                             # peers read the input


def test_an_ll_wait_that_gives_up_is_reported_as_an_ll_push(monkeypatch):
    import types

    import torch

    from hiercoll.executor.cuda import backend
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    err = torch.tensor([1, 0, -1, 2, 3, 0, 0, 0], dtype=torch.int64)
    prepared = types.SimpleNamespace(
        rank=1, kernel=types.SimpleNamespace(err=err, epoch=torch.zeros(3, dtype=torch.int32)),
        table=types.SimpleNamespace(row_names=["0.3"]))
    with pytest.raises(VerificationError, match=r"rank 1: op 0.3 timed out waiting for a peer's "
                       r"LL push \(a word carried epoch 2, needed 3\)"):
        backend.check_timeouts(prepared)


_LL_TIMEOUT = r'''
import json
import torch
from hiercoll.executor.cuda.lowering import Addr, KernelLaunch, RankProgram, Row, SymmetricLayout
from hiercoll.executor.cuda.table import encode
from hiercoll.kernels.program import KernelState, launch_rows
# a reduce of the input and an LL word nobody pushes: with a spin limit the kernel gives up
row = Row("0.1", 8, Addr(0, 64), (Addr(0, 0), Addr(0, 0)), True, False, 1.0, (), (), ll=4)
launch = KernelLaunch((row,), 1, True)
lay = SymmetricLayout({"input": 0, "output": 64}, {"input": 8, "output": 8}, 128)
prog = RankProgram(0, lay, 64, None, {0: (launch,)}, KernelLaunch((), 1, True), False, (), (),
                   True, 16, 1)
t = encode(prog, [0], [0])
err = torch.zeros(8, dtype=torch.int64)
state = KernelState(torch.tensor(t.words, dtype=torch.int64), torch.rand(128),
                    torch.zeros(64, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), err,
                    ll_half=prog.ll_half, in_delta=0, out_delta=64)
launch_rows(state, t.launches[id(launch)], reduce_op="sum", spin_limit=50)
print(json.dumps(err[:5].tolist()))
'''


def test_an_ll_read_with_a_spin_limit_gives_up_and_records_the_row():
    """The LL kernel's debug timeout (Triton's interpreter): flag, row, wait index -1 (an LL
    word), the epoch the word carried, the epoch needed."""
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    assert run_interpreted(_LL_TIMEOUT, timeout=300) == [1, 0, -1, 0, 1]
