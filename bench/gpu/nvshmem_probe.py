"""What torch's NVSHMEM path offers on this image, before the transport is built on it (issue 27).

`torchrun --nproc-per-node 2 bench/gpu/nvshmem_probe.py --out DIR`: the symmetric-memory backend
switch, PE numbering against torch ranks, the Triton device bindings' signatures, and one
multi-CTA put-with-signal kernel (ADD into a 64-bit slot read back as two int32 words, the
zero-byte put that signals a third party after a quiet) checked for correctness and timed per
size and CTA count against a copy-engine copy into the peer's mapping. Writes DIR/probe.json.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import triton
import triton.language as tl
from torch.distributed._symmetric_memory import _nvshmem_triton as nvs

SIGNAL_ADD = tl.constexpr(10)   # nvshmemx_signal_op_t (torch 2.11 docstrings say 5: wrong)
CMP_GE = tl.constexpr(5)       # nvshmem_cmp_type (the docstrings say 3: that is LE)



@nvs.requires_nvshmem
@triton.jit
def probe_put(dst, src, nbytes, chunk, sig, pe, third_sig, third_pe, HAS_THIRD: tl.constexpr):
    pid = tl.program_id(0)
    lo = pid.to(tl.int64) * chunk
    size = tl.minimum(chunk, nbytes - lo)
    nvs.putmem_signal_block(dst + lo, src + lo, size, sig, 1, SIGNAL_ADD, pe)
    if HAS_THIRD:
        nvs.quiet()
        nvs.putmem_signal_block(dst, src, lo * 0, third_sig, 1, SIGNAL_ADD, third_pe)


@nvs.requires_nvshmem
@triton.jit
def probe_wait(slot_ptr, target):
    nvs.wait_until(slot_ptr, CMP_GE, target)


@nvs.requires_nvshmem
@triton.jit
def probe_pe(out):
    tl.store(out, nvs.my_pe())
    tl.store(out + 1, nvs.n_pes())


def _settle(stage: str, rank: int, limit_s: float = 15.0) -> None:
    """Wait for the GPU with a time limit: a hung stage is named and the process leaves."""
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.perf_counter()
    while not ev.query():
        if time.perf_counter() - t0 > limit_s:
            print(f"rank {rank}: HUNG at {stage}", flush=True)
            os._exit(3)
        time.sleep(0.001)
    print(f"rank {rank}: {stage} done", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device())
    rec: dict = {"torch": torch.__version__, "triton": triton.__version__, "world": world}
    rec["nvshmem_available"] = symm_mem.is_nvshmem_available()
    rec["backend_before"] = symm_mem.get_backend(dev) if hasattr(symm_mem, "get_backend") else None
    symm_mem.set_backend("NVSHMEM")
    rec["backend_after"] = symm_mem.get_backend(dev)
    for name in ("putmem_signal_block", "wait_until", "signal_op", "quiet", "fence", "put"):
        fn = getattr(nvs, name, None)
        src = inspect.getsource(fn.fn if hasattr(fn, "fn") else fn) if fn else "missing"
        rec[f"sig_{name}"] = src.splitlines()[1:4] if fn else "missing"
    try:
        _exercise(rec, rank, world, dev)
    except Exception:     # noqa: BLE001 - the probe reports what failed
        import traceback
        rec["error"] = traceback.format_exc()[-3000:]
        print(rec["error"], flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"probe-r{rank}.json"), "w") as f:
        json.dump(rec, f, indent=1, default=str)
    if rank == 0:
        print(json.dumps({k: v for k, v in rec.items() if k != "puts"}, default=str), flush=True)
    dist.destroy_process_group()


def _exercise(rec: dict, rank: int, world: int, dev: torch.device) -> None:
    n = 64 << 20       # elements (bf16: 128 MiB)
    t0 = time.perf_counter()
    data = symm_mem.empty(n, dtype=torch.bfloat16, device=dev)
    sig = symm_mem.empty(64, dtype=torch.int32, device=dev)
    sig.zero_()
    hd = symm_mem.rendezvous(data, dist.group.WORLD.group_name)
    hs = symm_mem.rendezvous(sig, dist.group.WORLD.group_name)
    rec["alloc_s"] = time.perf_counter() - t0
    rec["data_ptrs"] = [int(p) for p in hd.buffer_ptrs]
    rec["sig_ptrs"] = [int(p) for p in hs.buffer_ptrs]
    rec["multicast_ptr"] = int(getattr(hd, "multicast_ptr", 0) or 0)
    pe = torch.zeros(2, dtype=torch.int32, device=dev)
    probe_pe[(1,)](pe)
    torch.cuda.synchronize()
    rec["my_pe_n_pes"] = pe.tolist()
    peer = (rank + 1) % world
    # one put, then the wait, then the third-party signal, each settled on its own
    probe_put[(1,)](data.data_ptr() + (n // 2) * 2, data.data_ptr(), 4096, 4096,
                    sig.data_ptr() + 8, peer, sig.data_ptr() + 16, rank, HAS_THIRD=False)
    _settle("first put", rank)
    probe_wait[(1,)](sig[2:], 1)
    _settle("first wait", rank)
    probe_put[(1,)](data.data_ptr() + (n // 2) * 2, data.data_ptr(), 4096, 4096,
                    sig.data_ptr() + 8, peer, sig.data_ptr() + 16, rank, HAS_THIRD=True)
    _settle("put + third", rank)
    rec["first_sig"] = sig[:8].tolist()
    print(rank, rec["first_sig"], flush=True)
    dist.barrier()
    dst_off = n // 2        # bytes of bf16 elements: half the allocation is the landing zone
    isz = 2
    results = []
    expect = {}
    for nbytes in (65536, 1 << 20, 16 << 20, 64 << 20):
        for ctas in (1, 8, 32, 64):
            if nbytes // ctas < 4096:
                continue
            chunk = -(-nbytes // ctas)
            chunk = -(-chunk // 16) * 16
            grid = -(-nbytes // chunk)
            count = nbytes // isz
            data[:count].copy_(torch.randn(count, device=dev).to(torch.bfloat16))
            sig.zero_()
            torch.cuda.synchronize()
            dist.barrier()
            slot, third = 2, 4
            dst_addr = data.data_ptr() + dst_off * isz
            iters = 20
            # third party: the sender signals itself after a quiet (a consumer on another rank)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for it in range(iters + 1):
                if it == 1:
                    start.record()
                probe_put[(grid,)](dst_addr, data.data_ptr(), nbytes, chunk,
                                   sig.data_ptr() + slot * 4, peer,
                                   sig.data_ptr() + third * 4, rank, HAS_THIRD=True)
                probe_wait[(1,)](sig[slot:], (it + 1) * grid)
            end.record()
            _settle(f"{nbytes} B x {grid} CTAs", rank)
            us = start.elapsed_time(end) * 1e3 / iters
            # the peer's data landed in my landing zone: compare with what the peer holds
            mine = data[dst_off:dst_off + count].clone()
            ref = data[:count].clone()
            gathered = [torch.empty_like(ref) for _ in range(world)]
            dist.all_gather(gathered, ref)
            theirs = gathered[(rank - 1) % world]
            sig_words = sig[:8].tolist()
            ok = bool(torch.equal(mine, theirs)) and sig_words[slot] == (iters + 1) * grid \
                and sig_words[slot + 1] == 0 and sig_words[third] == (iters + 1) * grid
            # the copy engine into the peer's mapping, same bytes
            pv = hd.get_buffer(peer, (count,), torch.bfloat16, dst_off)
            dist.barrier()
            s2, e2 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s2.record()
            for _ in range(iters):
                pv.copy_(data[:count], non_blocking=True)
            e2.record()
            torch.cuda.synchronize()
            ce_us = s2.elapsed_time(e2) * 1e3 / iters
            row = {"bytes": nbytes, "ctas": grid, "put_signal_wait_us": round(us, 2),
                   "put_GBps": round(nbytes / us / 1e3, 1), "ce_us": round(ce_us, 2),
                   "ce_GBps": round(nbytes / ce_us / 1e3, 1), "ok": ok, "sig": sig_words}
            results.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
            expect[(nbytes, grid)] = ok
    rec["puts"] = results
    # graph capture of the put + wait (the executor's runs are graphs)
    try:
        sig.zero_()
        torch.cuda.synchronize()
        dist.barrier()
        s = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            probe_put[(8,)](data.data_ptr() + dst_off * isz, data.data_ptr(), 1 << 20, 131072,
                            sig.data_ptr() + 8, peer, sig.data_ptr() + 16, rank, HAS_THIRD=False)
        torch.cuda.synchronize()
        dist.barrier()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        dist.barrier()
        rec["graph_put_slot"] = int(sig[2].item())
        rec["graph_ok"] = int(sig[2].item()) == 3 * 8
    except Exception as exc:     # noqa: BLE001 - the probe reports what failed
        rec["graph_error"] = repr(exc)[:400]
    all_ok = torch.tensor([int(all(expect.values()))], device=dev)
    dist.all_reduce(all_ok, op=dist.ReduceOp.MIN)
    rec["all_ok"] = bool(all_ok.item())


if __name__ == "__main__":
    main()
