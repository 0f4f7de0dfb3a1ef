"""Where an SM kernel loses NVLink bandwidth: pull vs push, CTAs, bytes in flight per CTA, and
the row kernel's own loop against a bare one on the same pattern.

Why: on 2 x H200 the simple lowering's reduce-scatter `direct` (a pull of the peer's half plus a
local add, one row) ran at 198 GB/s at 1 GiB where torch's symmetric-memory reduce-scatter ran at
266 GB/s, and all-reduce 16 MiB took 84 us against torch two-shot's 58. The same bytes over the
same links: the difference is the kernel's access pattern. Every rank runs each variant at once
(both directions of every link loaded, as in a collective), a CUDA graph of `--calls` launches,
median over repeats, slowest rank. Writes JSON and Markdown to --out.

    torchrun --nproc-per-node 2 bench/gpu/link_probe.py --out DIR [--sizes 8MiB,256MiB]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.common import stamp  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402
from hiercoll.units import parse_size  # noqa: E402


@triton.jit
def _move(src_a, src_b, dst, n, BLOCK: tl.constexpr, TWO: tl.constexpr):
    """dst = src_a (+ src_b): the bare pattern, pointers in registers, 16-byte accesses."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)
        m = offs < n
        x = tl.load(src_a + offs, mask=m)
        if TWO:
            x = x + tl.load(src_b + offs, mask=m)
        tl.store(dst + offs, x, mask=m)


def _pull_add_table(rank: int, peer: int, count: int, dst: int, peer_delta: int,
                    dev: torch.device) -> torch.Tensor:
    """The simple kernel's table (the backend's encoder) for one row: `count` elements of this
    rank's offset 0 plus the peer's offset 0 into this rank's `dst`; no waits, no signals."""
    from hiercoll.executor.cuda.lowering import Addr, KernelLaunch, RankProgram, Row, SymmetricLayout
    from hiercoll.executor.cuda.table import encode
    row = Row("0.0", count, Addr(rank, dst), (Addr(rank, 0), Addr(peer, 0)), True, False, 1.0,
              (), ())
    launch = KernelLaunch((row,), 1, True)
    program = RankProgram(rank, SymmetricLayout({}, {}, dst + count), 1, None, {0: (launch,)},
                          KernelLaunch((), 1, True), False)
    deltas = [0] * (max(rank, peer) + 1)
    deltas[peer] = peer_delta
    return torch.tensor(encode(program, deltas, deltas).words, dtype=torch.int64, device=dev)


def _graph(fn: Callable[[], Any], calls: int) -> torch.cuda.CUDAGraph:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


def _time(fn: Callable[[], Any], calls: int, reps: int) -> float:
    """Median microseconds per call, slowest rank (graph of `calls` launches)."""
    g = _graph(fn, calls)
    dist.barrier()
    torch.cuda.synchronize()
    g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="8MiB,256MiB", help="bytes each rank moves over the link")
    ap.add_argument("--grids", default="32,66,120,132,264")
    ap.add_argument("--blocks", default="2048,4096,8192,16384")
    ap.add_argument("--warps", default="4,8,16")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    import torch.distributed._symmetric_memory as symm_mem

    from hiercoll.kernels.abi import RowSpan
    from hiercoll.kernels.program import BLOCK, NUM_WARPS, KernelState, _kernel_args, _program_kernel, launch_rows

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    biggest = max(sizes) // 4
    # one fp32 allocation: a | b | out, each `biggest` elements
    buf = symm_mem.empty(3 * biggest, dtype=torch.float32, device=dev)
    buf.normal_()
    handle = symm_mem.rendezvous(buf, group=dist.group.WORLD.group_name)
    peer = (rank + 1) % world
    delta = (int(handle.buffer_ptrs[peer]) - int(handle.buffer_ptrs[rank])) // 4
    assert (int(handle.buffer_ptrs[peer]) - int(handle.buffer_ptrs[rank])) % 4 == 0
    rows: list[dict[str, Any]] = []

    def record(pattern: str, how: str, n_bytes: int, us: float, **kw: Any) -> None:
        row = {"pattern": pattern, "how": how, "bytes": n_bytes, "us": round(us, 2),
               "gbps": round(n_bytes / us / 1e3, 1), **kw}
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)

    for nbytes in sizes:
        n = nbytes // 4
        a = buf[:n]
        b = buf[biggest:biggest + n]
        out = buf[2 * biggest:2 * biggest + n]
        pa = handle.get_buffer(peer, (n,), torch.float32, 0)
        pout = handle.get_buffer(peer, (n,), torch.float32, 2 * biggest)
        patterns = {   # name: (src_a, src_b, dst, two)
            "pull_add": (a, pa, out, True), "push_add": (a, b, pout, True),
            "pull_copy": (pa, pa, out, False), "push_copy": (a, a, pout, False),
        }
        for name, (sa, sb, d, two) in patterns.items():
            for grid, block, warps in itertools.product(
                    [int(x) for x in args.grids.split(",")],
                    [int(x) for x in args.blocks.split(",")],
                    [int(x) for x in args.warps.split(",")]):
                if block // (32 * warps) < 4 or block // (32 * warps) > 64:
                    continue   # < one 16-byte vector a thread, or a register spill
                us = _time(partial(_move[(grid,)], sa, sb, d, n, BLOCK=block, TWO=two,
                                   num_warps=warps), args.calls, args.reps)
                record(name, "bare", nbytes, us, grid=grid, block=block, warps=warps)
        # the row kernel on the same pull-add, at the grids the lowering takes
        table = _pull_add_table(rank, peer, n, 2 * biggest, delta, dev)
        state = KernelState(table=table, data=buf, sig=torch.zeros(64, dtype=torch.int32, device=dev),
                            epoch=torch.zeros(130, dtype=torch.int32, device=dev),
                            err=torch.zeros(4096, dtype=torch.int64, device=dev))
        for grid in [int(x) for x in args.grids.split(",")]:
            if grid > 132:
                continue
            us = _time(partial(launch_rows, state, RowSpan(0, 1, grid, True), reduce_op="sum"),
                       args.calls, args.reps)
            record("pull_add", "row_kernel", nbytes, us, grid=grid, block=BLOCK, warps=NUM_WARPS)
            # the same kernel with other steps and warps (constexprs of the binary)
            base = list(_kernel_args(state, RowSpan(0, 1, grid, True), "sum", 0, False, False))
            at = _program_kernel.arg_names.index("BLOCK")
            for block, warps in itertools.product([int(x) for x in args.blocks.split(",")],
                                                  [int(x) for x in args.warps.split(",")]):
                if (block, warps) == (BLOCK, NUM_WARPS) or not 4 <= block // (32 * warps) <= 64:
                    continue
                kargs = [*base[:at], block, *base[at + 1:]]
                us = _time(partial(_program_kernel[(grid,)], *kargs, num_warps=warps),
                           args.calls, args.reps)
                record("pull_add", "row_kernel", nbytes, us, grid=grid, block=block, warps=warps)
        # the copy engine, both ways
        record("pull_copy", "copy_engine", nbytes, _time(partial(out.copy_, pa), args.calls,
                                                         args.reps))
        record("push_copy", "copy_engine", nbytes, _time(partial(pout.copy_, a), args.calls,
                                                         args.reps))
        # torch's kernels on the same bytes over the link (reduce-scatter of 2n: n pulled)
        rs_in = symm_mem.empty(2 * n, dtype=torch.float32, device=dev)
        symm_mem.rendezvous(rs_in, group=dist.group.WORLD.group_name)
        rs_out = torch.empty(n, dtype=torch.float32, device=dev)
        gname = dist.group.WORLD.group_name
        record("pull_add", "torch_reduce_scatter", nbytes, _time(
            partial(torch.ops.symm_mem.reduce_scatter_out, rs_in, gname, False, rs_out),
            args.calls, args.reps))
        record("pull_add+pull_copy", "torch_two_shot", 2 * nbytes, _time(
            partial(torch.ops.symm_mem.two_shot_all_reduce_, rs_in, "sum", gname),
            args.calls, args.reps))
        ws = torch.empty(2 * n, dtype=torch.float32, device=dev)
        record("nccl_reduce_scatter", "nccl", nbytes, _time(
            partial(dist.reduce_scatter_tensor, rs_out, ws), args.calls, args.reps))
    if rank == 0:
        outdir = Path(args.out)
        outdir.mkdir(parents=True, exist_ok=True)
        command = (f"torchrun --nproc-per-node {world} bench/gpu/link_probe.py "
                   + " ".join(sys.argv[1:]))
        doc = {"provenance": stamp(command), "world": world, "rows": rows}
        write_atomic(outdir / "link_probe.json", json.dumps(doc, indent=1))
        lines = ["| pattern | how | MiB | grid | block | warps | us | GB/s |", "|---" * 8 + "|"]
        best: dict[tuple[str, str, int], dict[str, Any]] = {}
        for r in rows:
            k = (r["pattern"], r["how"], r["bytes"])
            if k not in best or r["gbps"] > best[k]["gbps"]:
                best[k] = r
        for r in best.values():
            lines.append(f"| {r['pattern']} | {r['how']} | {r['bytes'] >> 20} | {r.get('grid', '')} "
                         f"| {r.get('block', '')} | {r.get('warps', '')} | {r['us']} | {r['gbps']} |")
        write_atomic(outdir / "link_probe.md", "\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
