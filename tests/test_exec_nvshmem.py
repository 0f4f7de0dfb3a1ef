"""`--inter-transport nvshmem` on CPU: what the lowering puts on the sender's net stream, the
64-bit signal slots, the emulator running every plan family with puts against numpy (random
interleavings, several calls), a put whose dependencies are dropped caught, and the one-line
refusals where NVSHMEM is not there."""

from __future__ import annotations

import dataclasses

import pytest
import triton
import triton.language as tl
from helpers import (
    bf16_spec,
    check_emulation,
    compile_sm90_ptx,
    h200_topology,
    lowering_cases,
    random_group_cast,
    random_group_reduce,
)

from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError, VerificationError
from hiercoll.executor.cuda import lowering
from hiercoll.executor.cuda.lowering import (
    CudaOptions,
    KernelLaunch,
    PutLaunch,
    lower,
    nvshmem_put_ctas,
)
from hiercoll.planner import applicable, plan

NVS = CudaOptions(ctas=2, inter_transport="nvshmem")


_topo, _spec = h200_topology, bf16_spec


def test_inter_node_copies_become_puts_on_the_sender_only():
    """hier all-gather on 2 nodes x 2 GPUs: every inter-node copy is one PutLaunch on its
    sender's net stream, waiting in its own kernel (no wait-row launch), no send/recv, no
    receiver work; the receiver is signalled first, on an even (64-bit) slot past the barrier
    slots, and its consumers wait for one signal per CTA of the put, reading the whole 64-bit
    word (wide); no other wait is wide."""
    s = plan(_topo(2, 2), _spec("all_gather", 4, 8), "hier").expand()
    progs = [lower(s, r, NVS) for r in range(4)]
    inter = [o for o in s.ops() if o.transport.value == "inter" and o.kind.value == "copy"]
    assert inter
    puts = {x.op: (r, x) for r, p in enumerate(progs) for x in p.net if isinstance(x, PutLaunch)}
    assert set(puts) == {o.id for o in inter}
    assert all(isinstance(x, PutLaunch) for p in progs for x in p.net)
    slots = {x.signals[0].slot: x.ctas for _, x in puts.values()}
    n = s.num_ops
    for op in inter:
        rank, put = puts[op.id]
        assert rank == op.srcs[0].rank and put.peer == op.dst.rank
        assert put.signals[0].rank == op.dst.rank
        slot = put.signals[0].slot
        assert slot % 2 == 0 and slot >= n + 2 * 4 + 1 and all(g.slot == slot for g in put.signals)
        assert put.ctas == nvshmem_put_ctas(op.dst.count * 2)
        assert progs[rank].num_slots >= slot + 2
    waits = [w for p in progs for items in (*p.streams.values(), p.net) for x in items
             for w in (x.waits if isinstance(x, PutLaunch) else
                       [w for row in x.rows for w in row.waits] if isinstance(x, KernelLaunch)
                       else [])]
    assert any(w.slot in slots for w in waits)
    for w in waits:       # every wait on a put's slot counts its CTAs and reads 64 bits
        assert w.wide == (w.slot in slots)
        if w.wide:
            assert w.per_epoch == slots[w.slot]
    # the hier all-gather's inter-node copies read what the intra-node step produced
    assert any(put.waits for _, put in puts.values())


def test_wide_waits_are_encoded_in_the_table_and_read_back():
    from hiercoll.executor.cuda.table import encode
    from hiercoll.kernels import abi
    s = plan(_topo(2, 2), _spec("all_gather", 4, 8), "hier").expand()
    prog = lower(s, 0, NVS)
    table = encode(prog, [0] * 4, [0] * 4)
    w = table.words
    seen = 0
    for r in range(len(table.row_names)):
        base = r * abi.ROW_WORDS
        for k in range(w[base + abi.F_NWAIT]):
            slot, word = w[w[base + abi.F_WAIT] + 2 * k], w[w[base + abi.F_WAIT] + 2 * k + 1]
            wide = word >> abi.WAIT_WIDE_SHIFT
            assert wide in (0, 1) and (word & ((1 << abi.WAIT_WIDE_SHIFT) - 1)) >= 1
            seen += wide
            assert not wide or slot % 2 == 0
    assert seen, "no row of rank 0 waits on a put: the case no longer tests the encoding"


def test_put_ctas_and_chunks_cover_the_bytes_and_every_cta_signals():
    from hiercoll.executor.cuda.lowering import put_chunk_bytes
    for nbytes in (2, 16, 4096, 512 * 1024, 512 * 1024 + 2, 3 << 20, 64 << 20, 1 << 30,
                   (1 << 30) + 6):
        ctas = nvshmem_put_ctas(nbytes)
        chunk = put_chunk_bytes(nbytes, ctas)
        assert 1 <= ctas <= lowering.NVSHMEM_MAX_CTAS and chunk % 16 == 0
        assert chunk * ctas >= nbytes                 # the last CTA's chunk ends at the end
        assert (ctas - 1) * chunk < nbytes or ctas == 1   # and none is left without bytes


FAMILIES = lowering_cases(((2, 2), (2, 1), (4, 1)))


@pytest.mark.parametrize(("nodes", "gpus", "kind", "algo"), FAMILIES)
def test_emulated_nvshmem_transport_matches_numpy(nodes, gpus, kind, algo):
    """Every family, channel streams and the graph's single stream, several calls: the puts
    land, their signals order every consumer, and slots count on across calls."""
    s = plan(_topo(nodes, gpus), _spec(kind, nodes * gpus, 41), algo, {"chunks": 2}).expand()
    check_emulation(s, NVS, seed=7)
    check_emulation(s, dataclasses.replace(NVS, single_stream=True), seed=8, calls=2)


@pytest.mark.parametrize("kind", ["group_cast", "group_reduce"])
@pytest.mark.parametrize("seed", [0, 1])
def test_emulated_nvshmem_group_collectives_match_numpy(kind, seed):
    """The de-duplicated group-cast / group-reduce (hier: one inter-node copy per destination
    node) and the flat plans, on random splits."""
    make = random_group_cast if kind == "group_cast" else random_group_reduce
    spec = CollectiveSpec(kind=kind, world_size=4, dtype="fp32", splits=make(4, seed, 9))
    topo = _topo(2, 2)
    algos = applicable(topo, spec)
    assert "hier" in algos
    for algo in algos:
        check_emulation(plan(topo, spec, algo).expand(), NVS, seed=11 + seed)


def test_emulator_catches_a_put_that_does_not_wait_for_what_it_sends(monkeypatch):
    """The put's own waits are load-bearing: without them the put sends a region before the op
    that writes it (hier all-reduce: the local reduce) has run, on some interleaving."""
    s = plan(_topo(2, 2), _spec("all_reduce", 4, 64), "hier").expand()
    real = lowering._put

    def no_wait(*args):  # type: ignore[no-untyped-def]
        return tuple(dataclasses.replace(x, waits=()) for x in real(*args))
    monkeypatch.setattr(lowering, "_put", no_wait)
    lowering._GLOBALS.clear()
    caught = 0
    for seed in range(12):
        try:
            check_emulation(s, NVS, seed=seed, calls=2)
        except (AssertionError, VerificationError):
            caught += 1
    assert caught, "dropping the put's waits went unnoticed on every interleaving"


def test_the_emulator_refuses_a_put_signal_that_is_not_a_64_bit_word(monkeypatch):
    s = plan(_topo(2, 1), _spec("all_gather", 2, 8), "direct").expand()
    real = lowering._put

    def odd(*args):  # type: ignore[no-untyped-def]
        return tuple(dataclasses.replace(x, signals=tuple(dataclasses.replace(g, slot=g.slot + 1)
                                                          for g in x.signals))
                     if isinstance(x, PutLaunch) else x for x in real(*args))
    monkeypatch.setattr(lowering, "_put", odd)
    with pytest.raises(VerificationError, match="not the low word of a 64-bit signal"):
        check_emulation(s, NVS, seed=1, calls=1)


def test_runs_report_the_transport_of_each_tier():
    s = plan(_topo(2, 2), _spec("all_gather", 4), "hier").expand()
    senders = {o.srcs[0].rank for o in s.ops() if o.transport.value == "inter"}
    for r in range(4):
        notes = " ".join(lower(s, r, NVS).notes)
        assert ("NVSHMEM put-with-signal" in notes) == (r in senders)
        assert "NVSHMEM" not in " ".join(lower(s, r, CudaOptions()).notes)
        assert "peer mappings" in " ".join(lower(s, r, CudaOptions(protocol="simple")).notes)


def test_without_nvshmem_a_request_is_one_line(monkeypatch):
    import torch
    import torch.distributed._symmetric_memory as symm_mem

    from hiercoll.executor.cuda import symm
    monkeypatch.setattr(symm_mem, "is_nvshmem_available", lambda: False, raising=False)
    with pytest.raises(HiercollError, match="is_nvshmem_available") as err:
        symm.use_nvshmem(torch.device("cpu"))
    assert "\n" not in str(err.value)


def test_nvshmem_after_a_cuda_backend_allocation_is_one_line(monkeypatch):
    import torch
    import torch.distributed._symmetric_memory as symm_mem

    from hiercoll.executor.cuda import symm
    monkeypatch.setattr(symm_mem, "is_nvshmem_available", lambda: True, raising=False)
    monkeypatch.setattr(symm_mem, "get_backend", lambda device: "CUDA", raising=False)
    chosen: list[str] = []
    monkeypatch.setattr(symm_mem, "set_backend", chosen.append, raising=False)
    monkeypatch.setattr(symm, "_ALLOCATIONS", 1)
    with pytest.raises(HiercollError, match="first plan or Communicator"):
        symm.use_nvshmem(torch.device("cpu"))
    assert not chosen
    monkeypatch.setattr(symm, "_ALLOCATIONS", 0)
    symm.use_nvshmem(torch.device("cpu"))
    assert chosen == ["NVSHMEM"]


def test_the_option_is_validated_and_named_in_the_cli():
    assert CudaOptions(inter_transport="nvshmem").inter_transport.value == "nvshmem"
    with pytest.raises(HiercollError, match="peer, nccl, nvshmem"):
        CudaOptions(inter_transport="ibgda")


def test_a_put_whose_signal_word_is_not_8_byte_aligned_is_refused_in_one_line():
    """The lowering gives puts even slots; the signal allocation itself must start on an 8-byte
    boundary (a pool view at a 4-byte offset would make every 64-bit signal straddle two slots)."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    import torch

    from hiercoll.executor.cuda.backend import _put_args
    from hiercoll.executor.cuda.lowering import Addr, Signal, Wait

    @dataclass
    class Buf:
        tensor: torch.Tensor

    data = Buf(torch.zeros(64, dtype=torch.bfloat16))
    put = PutLaunch("0.1", Addr(0, 0), Addr(1, 16), 16, 1, (Signal(1, 4), Signal(0, 4)), 1,
                    (Wait(2, 3, "0.0"), Wait(6, 1, "1.0", wide=True)))
    sig = torch.zeros(16, dtype=torch.int32)
    assert sig.data_ptr() % 8 == 0
    state = SimpleNamespace(epoch=torch.zeros(1, dtype=torch.int32),
                            err=torch.zeros(8, dtype=torch.int64))
    ok = _put_args(put, data, Buf(sig), 2, torch.device("cpu"), None, state, 0, -3)
    assert ok.sigs.tolist() == [sig.data_ptr() + 16] * 2 and ok.pes.tolist() == [1, 0]
    assert ok.nbytes == 32 and ok.dst - ok.src == 32
    # the put's waits in the row table's format: (slot, per_epoch | wide << 32)
    assert ok.waits.tolist() == [2, 3, 6, 1 | 1 << 32] and ok.n_wait == 2 and ok.row == -3
    with pytest.raises(HiercollError, match="not 8-byte aligned") as err:
        _put_args(put, data, Buf(sig[1:]), 2, torch.device("cpu"), None, state, 0, -3)
    assert "\n" not in str(err.value)


@triton.jit
def _stand_in_put(dst, src, size, sig, val, op, pe):
    tl.store(sig.to(tl.pointer_type(tl.int64)), size + val + op + pe)


@triton.jit
def _stand_in_quiet():
    pass


def test_the_put_kernel_waits_in_every_thread_and_reads_64_bit_signals_whole(monkeypatch):
    """The put kernel compiled for sm_90 (NVSHMEM's device calls replaced by stand-ins: the
    library is not on CI): its waits poll int32 slots and 64-bit signals each at their width,
    relaxed at system scope, and acquire with `fence.acq_rel.sys` before the put reads."""
    import types

    from triton.compiler import ASTSource

    from hiercoll.kernels import nvshmem_put
    fake = types.ModuleType("stand_in_nvshmem")
    fake.putmem_signal_block, fake.quiet = _stand_in_put, _stand_in_quiet  # type: ignore[attr-defined]
    monkeypatch.setattr(nvshmem_put, "_nvs", fake)
    sig = {"dst": "i64", "src": "i64", "nbytes": "i64", "chunk": "i64", "sigs": "*i64",
           "pes": "*i32", "n_sig": "i32", "sig": "*i32", "waits": "*i64", "n_wait": "i32",
           "epoch_ptr": "*i32", "spin_limit": "i32", "err_ptr": "*i64", "put_row": "i32",
           "LANES": "constexpr"}
    src = ASTSource(fn=nvshmem_put.hiercoll_nvshmem_put, signature=sig,
                    constexprs={"LANES": nvshmem_put.LANES.value})
    ptx = compile_sm90_ptx(src, nvshmem_put.NUM_WARPS)
    assert "ld.relaxed.sys.global.b64" in ptx and "ld.relaxed.sys.global.b32" in ptx
    assert "fence.acq_rel.sys" in ptx


@pytest.mark.parametrize(("nodes", "gpus", "kind", "algo"), lowering_cases(((2, 2),)))
def test_a_net_op_is_ordered_after_its_plan_channel_predecessor_in_one_stream(nodes, gpus, kind,
                                                                              algo):
    """Single stream (graph mode): a net op's explicit predecessor is the op before it on its
    owner's *plan channel*. The op before it in the stream may be another channel's, run by
    other CTAs: waiting on that one would order nothing (the first graph-mode failures)."""
    s = lowering.lowered_schedule(plan(_topo(nodes, gpus), _spec(kind, nodes * gpus, 41), algo,
                                       {"chunks": 2}).expand(), NVS)
    opts = dataclasses.replace(NVS, single_stream=True)
    g = lowering._global(s, opts)
    nets = [op for op in s.ops() if g.engines[op.ref] == lowering.Engine.NET]
    for op in nets:
        before = [o for o in s.rank_ops(op.rank)[:op.index] if o.channel == op.channel]
        assert g.explicit_prev(op.ref) == (before[-1].ref if before else None)
        after = [o for o in s.rank_ops(op.rank)[op.index + 1:] if o.channel == op.channel]
        if after:       # the plan-channel successor waits on the put
            assert g.explicit_prev(after[0].ref) == op.ref
            assert lowering._waiter(after[0], g.engines) in g.consumers[op.ref]


def test_in_one_stream_the_puts_are_launched_inline_by_their_senders():
    """Graph mode's single stream has no net stream (a sibling graph branch could be run after
    the main one while either spins on the other): each put is a launch of its sender's one
    stream, after the rows launched before it, at its level, and waits only for other ranks."""
    s = plan(_topo(2, 2), _spec("reduce_scatter", 4, 1 << 16), "hier").expand()
    opts = dataclasses.replace(NVS, single_stream=True)
    progs = [lower(s, r, opts) for r in range(4)]
    assert all(not p.net for p in progs)
    sent = {x.op for p in progs for items in p.streams.values() for x in items
            if isinstance(x, PutLaunch)}
    ran = lowering.lowered_schedule(s, opts)       # what the kernels run (copies forwarded)
    assert sent == {o.id for o in ran.ops() if o.transport.value == "inter"
                    and o.kind.value == "copy"}
    for r, p in enumerate(progs):
        (items,) = p.streams.values()
        for x in items:
            if isinstance(x, PutLaunch):
                owner, index = map(int, x.op.split("."))
                assert ran.op((owner, index)).srcs[0].rank == r
                # what this stream launched before the put is over when it starts: it waits
                # only for other ranks
                assert all(int(w.producer.split(".")[0]) != r for w in x.waits)
        notes = " ".join(p.notes)
        assert "inline on its one stream" in notes or not any(isinstance(x, PutLaunch)
                                                               for x in items)
    check_emulation(s, opts, seed=3, calls=3)


def test_capturing_nccl_send_recv_is_refused_in_one_line():
    from hiercoll.executor.cuda.backend import refuse_nccl_capture
    refuse_nccl_capture(True, False)       # eager: runs
    refuse_nccl_capture(False, True)       # a graph without NCCL p2p: runs
    with pytest.raises(HiercollError, match="cannot run inside a CUDA graph") as err:
        refuse_nccl_capture(True, True)
    assert "\n" not in str(err.value) and "nvshmem" in str(err.value)


def test_a_put_kernels_timeout_names_the_put_and_the_producer_it_waited_for():
    """The put kernel records row -1 - its `put_launches` index and the wait index; the line
    names that put's op and the producer of that wait (CPU: the record is made up)."""
    from hiercoll.executor.cuda.backend import put_timeout_line
    from hiercoll.executor.cuda.lowering import put_launches
    s = plan(_topo(2, 2), _spec("all_reduce", 4, 64), "hier").expand()
    for r in range(4):
        prog = lower(s, r, NVS)
        for i, put in enumerate(put_launches(prog)):
            for k, wait in enumerate(put.waits):
                line = put_timeout_line(prog, [1, -1 - i, k, 3, 8, 0, 0, 0], 2)
                assert line == (f"rank {r}: the put of op {put.op} timed out waiting for "
                                f"{wait.producer} (slot value 3, needed 8; epoch 2)")
    assert any(put.waits for r in range(4) for put in put_launches(lower(s, r, NVS)))
