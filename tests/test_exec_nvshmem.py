"""`--inter-transport nvshmem` on CPU: what the lowering puts on the sender's net stream, the
64-bit signal slots, the emulator running every plan family with puts against numpy (random
interleavings, several calls), a put whose dependencies are dropped caught, and the one-line
refusals where NVSHMEM is not there."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import bf16_spec, check_emulation, h200_topology, lowering_cases, random_group_cast, random_group_reduce

from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError, VerificationError
from hiercoll.executor.cuda import lowering
from hiercoll.executor.cuda.lowering import (
    CudaOptions,
    KernelLaunch,
    PutLaunch,
    RecvLaunch,
    SendLaunch,
    lower,
    nvshmem_put_ctas,
)
from hiercoll.planner import applicable, plan

NVS = CudaOptions(ctas=2, inter_transport="nvshmem")


_topo, _spec = h200_topology, bf16_spec


def test_inter_node_copies_become_puts_on_the_sender_only():
    """hier all-gather on 2 nodes x 2 GPUs: every inter-node copy is one PutLaunch on its
    sender's net stream (behind a wait row where it reads something produced in the call), no
    send/recv, no receiver work; the receiver is signalled first, on an even (64-bit) slot past
    the barrier slots, and its consumers wait for one signal per CTA of the put."""
    s = plan(_topo(2, 2), _spec("all_gather", 4, 8), "hier").expand()
    progs = [lower(s, r, NVS) for r in range(4)]
    inter = [o for o in s.ops() if o.transport.value == "inter" and o.kind.value == "copy"]
    assert inter
    puts = {x.op: (r, x) for r, p in enumerate(progs) for x in p.net if isinstance(x, PutLaunch)}
    assert set(puts) == {o.id for o in inter}
    assert not any(isinstance(x, (SendLaunch, RecvLaunch)) for p in progs for x in p.net)
    n = s.num_ops
    for op in inter:
        rank, put = puts[op.id]
        assert rank == op.srcs[0].rank and put.peer == op.dst.rank
        assert put.signals[0].rank == op.dst.rank
        slot = put.signals[0].slot
        assert slot % 2 == 0 and slot >= n + 2 * 4 + 1 and all(g.slot == slot for g in put.signals)
        assert put.ctas == nvshmem_put_ctas(op.dst.count * 2)
        for p in progs:       # every wait on this op's slot counts the put's CTAs
            for items in (*p.streams.values(), p.net):
                for x in items:
                    if isinstance(x, KernelLaunch):
                        for row in x.rows:
                            for w in row.waits:
                                if w.slot == slot:
                                    assert w.per_epoch == put.ctas
        assert progs[rank].num_slots >= slot + 2
    net0 = progs[0].net
    for i, item in enumerate(net0):
        if isinstance(item, PutLaunch) and i:
            prev = net0[i - 1]
            assert not isinstance(prev, KernelLaunch) or prev.rows[0].op.endswith(":wait")


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
    """The wait row in front of a put is load-bearing: without it the put sends a region before
    the op that writes it (hier all-reduce: the local reduce) has run, on some interleaving."""
    s = plan(_topo(2, 2), _spec("all_reduce", 4, 64), "hier").expand()
    real = lowering._put

    def no_wait(*args):  # type: ignore[no-untyped-def]
        return tuple(x for x in real(*args) if isinstance(x, PutLaunch))
    monkeypatch.setattr(lowering, "_put", no_wait)
    lowering._GLOBALS.clear()
    caught = 0
    for seed in range(12):
        try:
            check_emulation(s, NVS, seed=seed, calls=2)
        except (AssertionError, VerificationError):
            caught += 1
    assert caught, "dropping the put's wait row went unnoticed on every interleaving"


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

    import torch

    from hiercoll.executor.cuda.backend import _put_args
    from hiercoll.executor.cuda.lowering import Addr, Signal

    @dataclass
    class Buf:
        tensor: torch.Tensor

    data = Buf(torch.zeros(64, dtype=torch.bfloat16))
    put = PutLaunch("0.1", Addr(0, 0), Addr(1, 16), 16, 1, (Signal(1, 4), Signal(0, 4)), 1)
    sig = torch.zeros(16, dtype=torch.int32)
    assert sig.data_ptr() % 8 == 0
    ok = _put_args(put, data, Buf(sig), 2, torch.device("cpu"), None)
    assert ok.sigs.tolist() == [sig.data_ptr() + 16] * 2 and ok.pes.tolist() == [1, 0]
    assert ok.nbytes == 32 and ok.dst - ok.src == 32
    with pytest.raises(HiercollError, match="not 8-byte aligned") as err:
        _put_args(put, data, Buf(sig[1:]), 2, torch.device("cpu"), None)
    assert "\n" not in str(err.value)
