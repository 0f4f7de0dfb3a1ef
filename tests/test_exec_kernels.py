"""The Triton row kernel compiles for Hopper without a GPU, and the generated code has what the
memory-ordering rules ask for; its data path runs in Triton's CPU interpreter. CI installs
triton through the dev extra (whichever release fits the torch installed: the CPU build brings
none, a CUDA build pins its own), so these run on every change; a CI run without it fails here
rather than skipping silently."""

from __future__ import annotations

import os
import re

import pytest
from helpers import compile_sm90_ptx, run_interpreted

if os.environ.get("CI") == "true":
    import triton  # noqa: F401 - CI must run the kernel tests: a missing triton is a failure
triton = pytest.importorskip("triton")
pytest.importorskip("torch")


def _ordered_ops(ptx: str, sem: str) -> list[str]:
    """PTX instructions with `sem` (release/acquire) at system scope, however this Triton spells
    them: `atom.global.sys.release.add`, `red.global.sys.release.add`, `atom.release.sys...`,
    `ld.acquire.sys...` all count (versions differ in the opcode and the qualifier order)."""
    found = []
    for line in ptx.splitlines():
        words = line.strip().split()
        if words and words[0].startswith("@"):     # a predicate guard: `@%p4 atom...`
            words = words[1:]
        if not words:
            continue
        quals = words[0].rstrip(";").split(".")
        if quals[0] in ("atom", "red", "ld", "st") and sem in quals and "sys" in quals:
            found.append(words[0])
        elif quals[0] == "fence" and "sys" in quals and ({"acq_rel", "sc"} & set(quals)):
            found.append(words[0].rstrip(";"))   # a fence after relaxed reads: an acquire
    return found


def _ptx(dtype: str, aligned: bool, ptx: bool = True, also: bool = False) -> str:
    from triton.compiler import ASTSource

    from hiercoll.kernels.program import _program_kernel
    sig = {"table": "*i64", "data": f"*{dtype}", "sig": "*i32", "epoch_ptr": "*i32",
           "err_ptr": "*i64", "first_row": "i32", "num_rows": "i32", "spin_limit": "i32",
           "REDUCE": "constexpr", "ACC": "constexpr", "ALIGNED": "constexpr", "VEC": "constexpr",
           "BLOCK": "constexpr", "LANES": "constexpr", "BUMP_EPOCH": "constexpr",
           "FUSED": "constexpr", "PTX": "constexpr", "TRACE": "constexpr",
           "ALSO": "constexpr"}
    consts = {"REDUCE": 0, "ACC": triton.language.float32, "ALIGNED": aligned,
              "VEC": 8 if dtype == "bf16" else 4, "BLOCK": 4096, "LANES": 256,
              "BUMP_EPOCH": False, "FUSED": False, "PTX": ptx, "TRACE": False, "ALSO": also}
    attrs = {(k,): [["tt.divisibility", 16]] for k in range(5)}
    src = ASTSource(fn=_program_kernel, signature=sig, constexprs=consts, attrs=attrs)
    return compile_sm90_ptx(src, 8)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_signals_are_system_scope_release_and_acquire(dtype):
    ptx = _ptx(dtype, aligned=True)
    releases = _ordered_ops(ptx, "release")
    acquires = _ordered_ops(ptx, "acquire")
    assert any(op.split(".")[0] in ("atom", "red") and "add" in op.split(".") for op in releases)
    assert acquires, "no system-scope acquire: consumers could read stale peer data"
    assert "bar.sync" in ptx    # the CTA barrier between data stores and the release
    # the lowering's relaxed arrivals (Row.relaxed) have their own instruction beside the release
    assert "red.relaxed.sys.global.add.s32" in ptx
    # an NVSHMEM put's 64-bit signal is polled as a whole 64-bit word (a wide wait)
    assert "ld.relaxed.sys.global.b64" in ptx and "ld.relaxed.sys.global.b32" in ptx


def test_the_ordering_check_reads_every_spelling():
    ptx = "\n".join(["\tred.global.sys.release.add.s32 [%rd1], 1;",
                     "\tatom.release.sys.global.add.u32 %r1, [%rd2], 1;",
                     "\t@%p4 ld.acquire.sys.global.b32 %r2, [%rd3];",
                     "\tatom.global.gpu.acquire.add.u32 %r3, [%rd4], 0;",
                     "\tfence.acq_rel.sys;", "\tfence.acq_rel.gpu;"])
    assert len(_ordered_ops(ptx, "release")) == 3
    # gpu scope: not enough
    assert _ordered_ops(ptx, "acquire") == ["ld.acquire.sys.global.b32", "fence.acq_rel.sys"]


def test_aligned_rows_use_16_byte_accesses_and_unaligned_rows_do_not():
    assert re.search(r"ld\.global[^\n]*\.v4", _ptx("bf16", aligned=True))
    assert not re.search(r"ld\.global[^\n]*\.v4", _ptx("bf16", aligned=False))
    # the ALSO variant's more destinations are 16-byte stores too; without ALSO none of its code
    more = _ptx("bf16", aligned=True, also=True)
    assert len(re.findall(r"st\.global[^\n]*\.v4", more)) > len(
        re.findall(r"st\.global[^\n]*\.v4", _ptx("bf16", aligned=True)))


# ---- the data path, run by Triton's CPU interpreter (TRITON_INTERPRET=1 in a subprocess) -------
_INTERPRET = r'''
import json, sys
import torch
from hiercoll.executor.cuda.lowering import (Addr, KernelLaunch, RankProgram, Row, Signal,
                                             SymmetricLayout, Wait)
from hiercoll.executor.cuda.table import encode
from hiercoll.kernels.program import KernelState, launch_rows

def run(rows, grid, dtype, reduce_op, epoch=1, slots=None, spin_limit=0, bump=False):
    torch.manual_seed(0)
    data = (torch.rand(600) + 0.25).to(dtype)
    sig = torch.zeros(16, dtype=torch.int32)
    for k, v in (slots or {}).items():
        sig[k] = v
    launch = KernelLaunch(tuple(rows), grid, False)
    prog = RankProgram(0, SymmetricLayout({}, {}, 600), 16, None, {0: (launch,)},
                       KernelLaunch((), 1, True), False)
    t = encode(prog, [0], [0])
    table = torch.tensor(t.words, dtype=torch.int64)
    before = data.clone()
    err = torch.zeros(8, dtype=torch.int64)
    enc = t.launches[id(launch)]
    ep = torch.tensor([epoch], dtype=torch.int32)
    launch_rows(KernelState(table, data, sig, ep, err), enc, reduce_op=reduce_op,
                spin_limit=spin_limit, bump_epoch=bump)
    run.epoch = int(ep[0])
    return before.double(), data.double(), sig, err

out = {}
# copy at odd offsets on 3 CTAs, then a 3-source reduce with accumulate and scale that waits on it
rows = [Row("0.0", 37, Addr(0, 201), (Addr(0, 3),), False, False, 1.0, (), (Signal(0, 2),)),
        Row("0.1", 50, Addr(0, 301), (Addr(0, 0), Addr(0, 101), Addr(0, 151)), True, True, 0.5,
            (Wait(2, 1, "0.0"),), (Signal(0, 3), Signal(0, 3)))]
b, a, sig, err = run(rows, 1, torch.float32, "sum")
out["copy"] = float((a[201:238] - b[3:40]).abs().max())
want = b[301:351] + 0.5 * (b[0:50] + b[101:151] + b[151:201])
out["reduce"] = float((a[301:351] - want).abs().max())
out["untouched"] = float((a[238:301] - b[238:301]).abs().max())
out["slots"] = sig[:4].tolist()
b, a, sig, err = run([Row("0.0", 333, Addr(0, 260), (Addr(0, 0), Addr(0, 1)), True, False, 1.0,
                          (), (Signal(0, 5),))], 3, torch.bfloat16, "max")
out["max_bf16"] = float((a[260:593] - torch.maximum(b[0:333], b[1:334])).abs().max())
out["grid_signals"] = int(sig[5])
# ten sources: the first eight are loaded together (SRC_UNROLL), the rest one at a time
srcs = tuple(Addr(0, 20 * i) for i in range(10))
b, a, sig, err = run([Row("0.0", 20, Addr(0, 400), srcs, True, False, 1.0, (), ())], 2,
                     torch.float32, "min")
want = torch.stack([b[20 * i:20 * i + 20] for i in range(10)]).min(0).values
out["min10"] = float((a[400:420] - want).abs().max())
# a wait that is never satisfied: with a spin limit the kernel gives up and says who it waited on
rows = [Row("1.4", 8, Addr(0, 500), (Addr(0, 0),), False, False, 1.0, (Wait(7, 2, "0.3"),), ())]
_, _, _, err = run(rows, 1, torch.float32, "sum", epoch=3, slots={7: 5}, spin_limit=50)
out["timeout"] = err[:5].tolist()
# the start barrier's launch bumps the epoch before its waits: slot 7 at 4 satisfies 2 x (1 + 1)
_, _, _, err = run(rows, 1, torch.float32, "sum", epoch=1, slots={7: 4}, spin_limit=50, bump=True)
out["bumped"] = [run.epoch, int(err[0])]
# rows of one level on parts of the grid (F_CTAS): each runs on its own CTAs only
rows = [Row("0.0", 150, Addr(0, 300), (Addr(0, 0),), False, False, 1.0, (), (Signal(0, 8),),
            ctas=(0, 2)),
        Row("0.1", 140, Addr(0, 450), (Addr(0, 150), Addr(0, 151)), True, False, 1.0, (),
            (Signal(0, 9),), ctas=(2, 5))]
b, a, sig, err = run(rows, 5, torch.float32, "sum")
out["ranges"] = [float((a[300:450] - b[0:150]).abs().max()),
                 float((a[450:590] - (b[150:290] + b[151:291])).abs().max()),
                 int(sig[8]), int(sig[9])]
# a row's more destinations (Row.also): a bf16 reduce stored to three places, a copy to two
rows = [Row("0.0", 60, Addr(0, 300), (Addr(0, 0), Addr(0, 100)), True, False, 1.0, (),
            (Signal(0, 10),), also=(Addr(0, 380), Addr(0, 460))),
        Row("0.1", 33, Addr(0, 200), (Addr(0, 250),), False, False, 1.0, (), (),
            also=(Addr(0, 540),))]
b, a, sig, err = run(rows, 2, torch.bfloat16, "sum")
want = (b[0:60].float() + b[100:160].float()).to(torch.bfloat16).double()
out["also"] = [float(((a[300:360] - want) / want).abs().max())] + [
    float((a[o:o + 60] - a[300:360]).abs().max()) for o in (380, 460)] + [
    float((a[200:233] - b[250:283]).abs().max()), float((a[540:573] - b[250:283]).abs().max()),
    float((a[360:380] - b[360:380]).abs().max()), int(sig[10])]
print(json.dumps(out))
'''


def test_kernel_data_path_in_the_triton_interpreter():
    out = run_interpreted(_INTERPRET, timeout=300)
    assert out["copy"] == 0.0 and out["untouched"] == 0.0
    assert out["reduce"] < 1e-5                   # fp32: accumulate, scale, round once
    assert out["slots"] == [0, 0, 1, 2]           # one CTA: +1 per signal entry
    assert out["max_bf16"] == 0.0
    assert out["grid_signals"] == 3               # one add per CTA
    assert out["min10"] == 0.0
    assert out["timeout"] == [1, 0, 0, 5, 6]      # flag, row, wait index, seen, needed (2 x 3)
    assert out["bumped"] == [2, 0]                # epoch 1 -> 2, the wait for 4 passed
    assert out["ranges"][0] == 0.0 and out["ranges"][1] < 1e-6   # fp32 sum, rounded once
    assert out["ranges"][2:] == [2, 3]            # one signal per CTA of each row's range
    assert out["also"][0] < 2 ** -7                # the bf16 sum, rounded once (either way)
    assert out["also"][1:] == [0.0] * 5 + [2]     # the same bits at every destination
