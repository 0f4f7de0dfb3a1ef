"""`Communicator`: torch.distributed-shaped collectives that run hiercoll plans.

    comm = Communicator(group=tp_group)           # topology "auto", backend from the group
    comm.all_reduce(t)                             # in place, like dist.all_reduce
    work = comm.all_gather_into_tensor(out, inp, async_op=True); work.wait()

Per call: the plan for (collective, dtype, op, size bucket) comes from the LRU of prepared plans
(`plan_cache.py`), else is chosen (the tuning file's entry for the bucket, else the planner's
simulated auto-pick) and prepared once on the existing backends (gloo, cuda, or the library for
`nccl` picks: harness/prepare.BackendChoice says which runs a plan). The call pads its data into
the bucket's buffers, runs, and copies the result out.

Memory: one pool per communicator (`buffer_pool.py`), grown geometrically, shared by every plan
and size: on cuda the plans' symmetric data arrays are views of it and their signal ranges come
from a second small pool; released by `close()`.

Streams and graphs (cuda): a call forks the communicator's stream from the current one, enqueues
there, and joins back with an event (async_op: the Work's wait() joins). Nothing in a call with a
prepared plan syncs the host, so calls can be captured in a CUDA graph once each size bucket was
called eagerly (preparing a plan, or growing the pool, inside capture is refused in one line).
gloo completes every call on the calling thread (async handles come back completed).

Every rank of the group must make the same calls in the same order (as with torch.distributed).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hiercoll.collectives import CollectiveSpec, DType, GroupSplits, Kind, ReduceOp
from hiercoll.errors import HiercollError
from hiercoll.executor.backends import get_backend
from hiercoll.executor.cuda.lowering import CudaOptions, ll_applies, runs_in_place
from hiercoll.executor.interface import Backend, BackendName, Prepared
from hiercoll.executor.library import all_gather_single, library_call
from hiercoll.executor.torch_dtypes import torch_dtype
from hiercoll.harness.prepare import BackendChoice
from hiercoll.planner.search.library import library_schedule
from hiercoll.planner.search.select import plan_with
from hiercoll.planner.search.tuning_path import check_tuning_path
from hiercoll.schedule import LIBRARY_ALGORITHM, Schedule
from hiercoll.topology import Topology
from hiercoll.torch import patching as _patch
from hiercoll.torch.buffer_pool import BufferPool, SlotArena, align
from hiercoll.torch.plan_cache import MIN_BUCKET, PlanCache, PlanKey, size_bucket
from hiercoll.torch.reference import unfused_add_rms_norm
from hiercoll.torch.resolve import dtype_of, reduce_op, resolve_backend, resolve_topology
from hiercoll.torch.staging import library_beats_staged
from hiercoll.torch.work import Work

Pack = Callable[[torch.Tensor, torch.Tensor], None]     # (plan input, plan output) <- user data
Unpack = Callable[[torch.Tensor], None]                  # user data <- plan output


@dataclass
class _Entry:
    """A prepared plan and what it was prepared against."""

    key: PlanKey
    schedule: Schedule
    how: str                       # "tuning file ...", "searched (simulated)", "named"
    executor: dict[str, Any]       # the tuning file's backend knobs for this plan (may be empty)
    backend: Backend
    prepared: Prepared
    pooled: bool                   # its buffers are views of the pools (a cuda plan)
    generation: tuple[int, int, int]

    @property
    def algorithm(self) -> str:
        return self.schedule.meta.algorithm


class Communicator:
    """Collectives over `group` (None: WORLD) with hiercoll plans.

    topology: "auto" (nodes from LOCAL_WORLD_SIZE, H200 costs), a preset name (as many nodes as
    the group needs) or a topology file; a topology of another size is refused. tuning: a
    `hiercoll autopick -o` file (its entry for each size, else a search). backend: "auto" (cuda on
    an NCCL group, gloo on a gloo group), "cuda", "gloo", or "nccl" (every call is the library's).
    algorithm: "auto" or one algorithm for every call (tests, comparisons).
    """

    def __init__(self, group: Any = None, topology: str | Path | Topology = "auto",
                 tuning: str | Path | None = None, backend: str = "auto", *,
                 algorithm: str = "auto", max_plans: int = 32, max_pool_bytes: int = 1 << 30,
                 min_bucket: int = MIN_BUCKET, cuda_options: dict[str, Any] | None = None) -> None:
        if not dist.is_initialized():
            raise HiercollError("communicator: torch.distributed is not initialised; call "
                                "dist.init_process_group first")
        self._group = None if group is None or group == dist.group.WORLD else group
        if dist.get_rank(self._group) < 0:
            raise HiercollError("communicator: this process is not a member of `group`; make "
                                "the communicator on the group's ranks only")
        self._rank = dist.get_rank(self._group)
        self._world = dist.get_world_size(self._group)
        self._backend = resolve_backend(backend, self._group)
        self._topology = resolve_topology(topology, self._group)
        if tuning is not None:
            check_tuning_path(tuning)
        self._tuning = None if tuning is None else str(tuning)
        self._algorithm = LIBRARY_ALGORITHM if self._backend == BackendName.NCCL else algorithm
        self._min_bucket = int(min_bucket)
        on_gpu = str(dist.get_backend(self._group)) == "nccl"
        self._device = (torch.device("cuda", torch.cuda.current_device()) if on_gpu
                        else torch.device("cpu"))
        self._symmetric = self._backend == BackendName.CUDA
        self._choice = BackendChoice(self._backend if self._backend != BackendName.NCCL
                                     else BackendName.GLOO if not on_gpu else BackendName.CUDA,
                                     dict(cuda_options or {}))
        if self._symmetric and self._choice.nvshmem:
            from hiercoll.executor.cuda.symm import use_nvshmem
            use_nvshmem(self._device)      # before the pools' first allocation
        # by backend and options, as the harness's PrepareCache: tuned knobs differ per plan
        self._backends: dict[tuple[BackendName, tuple[tuple[str, Any], ...]], Backend] = {}
        self.pool = BufferPool(self._device, self._group, self._symmetric, max_pool_bytes)
        self.signal_pool = BufferPool(self._device, self._group, self._symmetric,
                                      max_pool_bytes, min_bytes=64 << 10, what="signal")
        self._slots = SlotArena(self.signal_pool)
        self._slot_resets = 0
        self.plans: PlanCache[_Entry] = PlanCache(max_plans)
        self._stream: Any = torch.cuda.Stream(device=self._device) if on_gpu else None
        self._extra: list[Any] = []       # allocations made through symmetric() (fused kernel)
        self._user: list[Any] = []        # the ones empty() handed out (zero-copy calls)
        # (plan key, where input and output live) -> (the plan's prepared call, its rebased twin)
        self._rebased: dict[Any, tuple[Any, Any]] = {}
        self._direct_calls: dict[Any, Callable[[torch.Tensor, torch.Tensor], None]] = {}
        self._closed = False

    # ---- what the fused kernel's ctx needs ------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    @property
    def group(self) -> Any:
        return self._group

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def topology(self) -> Topology:
        return self._topology

    @property
    def backend(self) -> BackendName:
        return self._backend

    def symmetric(self, nbytes: int) -> Any:
        """A new collective symmetric allocation of `nbytes` (every rank, same order), owned by
        this communicator and released at close(): the fused kernel's buffers and signals."""
        self._check_open()
        if not self._symmetric:
            raise HiercollError("communicator: symmetric memory needs the cuda backend")
        from hiercoll.executor.cuda.symm import allocate
        alloc = allocate(max(int(nbytes), 16), torch.uint8, self._device, self._group,
                         keep_alive=False)
        self._extra.append(alloc)
        return alloc

    def empty(self, *size: int | tuple[int, ...], dtype: torch.dtype = torch.bfloat16
              ) -> torch.Tensor:
        """A tensor in this communicator's symmetric memory, like torch's `symm_mem.empty`
        (collective: every rank of the group, same order, same size). Collectives on it skip the
        copies into and out of the plans' buffers: the plan's rows read and write it where it
        is (`all_reduce(t)` in place where the plan's kernels are safe so, which
        `lowering.runs_in_place` checks; else it copies as for any tensor). Every rank must pass
        the same tensor of its allocation (the same offset), as with torch's symmetric memory.
        Freed at close(). On gloo (or the library backend) a plain tensor: nothing to skip."""
        self._check_open()
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) \
            else tuple(int(x) for x in size)          # type: ignore[arg-type]
        if not self._symmetric:
            return torch.empty(shape, dtype=dtype, device=self._device)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        alloc = self.symmetric(align(max(nbytes, 16)))
        self._user.append(alloc)
        return alloc.tensor[:nbytes].view(dtype).view(shape)

    # ---- collectives ----------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: Any = ReduceOp.SUM,
                   async_op: bool = False) -> Work | None:
        """In place, like dist.all_reduce."""
        flat = self._flat(tensor, "tensor")
        n = flat.numel()
        b = self._bucket(n, flat)

        def pack(inp: torch.Tensor, out: torch.Tensor) -> None:
            inp[:n].copy_(flat)

        def unpack(out: torch.Tensor) -> None:
            flat.copy_(out[:n])
        return self._call(Kind.ALL_REDUCE, flat, reduce_op(op), b, b, pack, unpack, async_op,
                          (tensor,), direct=(flat, flat, n))

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor,
                              op: Any = ReduceOp.SUM, async_op: bool = False) -> Work | None:
        """output <- this rank's shard of the reduction of every rank's input (W shards)."""
        w = self._world
        out_flat, in_flat = self._flat(output, "output"), self._flat(input, "input")
        self._same_dtype(out_flat, in_flat)
        m = out_flat.numel()
        if in_flat.numel() != w * m:
            raise HiercollError(f"input: {in_flat.numel()} elements, needs world_size x output "
                                f"= {w} x {m}")
        b = self._bucket(m, in_flat, out_flat)

        def pack(inp: torch.Tensor, out: torch.Tensor) -> None:
            inp.view(w, b)[:, :m].copy_(in_flat.view(w, m))

        def unpack(out: torch.Tensor) -> None:
            out_flat.copy_(out[:m])
        return self._call(Kind.REDUCE_SCATTER, in_flat, reduce_op(op), b, w * b, pack, unpack,
                          async_op, (output, input), direct=(in_flat, out_flat, w * m))

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor,
                               async_op: bool = False) -> Work | None:
        """output <- every rank's input, in rank order."""
        w = self._world
        out_flat, in_flat = self._flat(output, "output"), self._flat(input, "input")
        self._same_dtype(out_flat, in_flat)
        m = in_flat.numel()
        if out_flat.numel() != w * m:
            raise HiercollError(f"output: {out_flat.numel()} elements, needs world_size x input "
                                f"= {w} x {m}")
        b = self._bucket(m, in_flat, out_flat)

        def pack(inp: torch.Tensor, out: torch.Tensor) -> None:
            inp[:m].copy_(in_flat)

        def unpack(out: torch.Tensor) -> None:
            out_flat.view(w, m).copy_(out.view(w, b)[:, :m])
        return self._call(Kind.ALL_GATHER, in_flat, ReduceOp.SUM, b, w * b, pack, unpack,
                          async_op, (output, input), direct=(in_flat, out_flat, w * m))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: list[int] | None = None,
                          input_split_sizes: list[int] | None = None,
                          async_op: bool = False) -> Work | None:
        """Like dist.all_to_all_single. Equal splits run an all-to-all plan (capturable); split
        sizes run a group_cast whose splits are first all-gathered (a host sync)."""
        w = self._world
        out_flat, in_flat = self._flat(output, "output"), self._flat(input, "input")
        self._same_dtype(out_flat, in_flat)
        if output_split_sizes is not None or input_split_sizes is not None:
            return self._all_to_all_v(output, input, output_split_sizes, input_split_sizes,
                                      async_op)
        if in_flat.numel() % w or out_flat.numel() != in_flat.numel():
            raise HiercollError(f"input/output: {in_flat.numel()} and {out_flat.numel()} elements; "
                                f"equal splits need the same count, a multiple of {w}")
        m = in_flat.numel() // w
        b = self._bucket(m, in_flat, out_flat)

        def pack(inp: torch.Tensor, out: torch.Tensor) -> None:
            inp.view(w, b)[:, :m].copy_(in_flat.view(w, m))

        def unpack(out: torch.Tensor) -> None:
            out_flat.view(w, m).copy_(out.view(w, b)[:, :m])
        return self._call(Kind.ALL_TO_ALL, in_flat, ReduceOp.SUM, b, w * b, pack, unpack,
                          async_op, (output, input), direct=(in_flat, out_flat, w * m))

    def group_cast(self, output: torch.Tensor, input: torch.Tensor,
                   splits: GroupSplits | dict[str, Any], async_op: bool = False) -> Work | None:
        """MagiAttention-style group-cast with every rank's `splits` (collectives.GroupSplits):
        input splits go to their listed ranks, output splits come from their one source."""
        return self._grouped(Kind.GROUP_CAST, output, input, splits, ReduceOp.SUM, async_op)

    def group_reduce(self, output: torch.Tensor, input: torch.Tensor,
                     splits: GroupSplits | dict[str, Any], op: Any = ReduceOp.SUM,
                     async_op: bool = False) -> Work | None:
        """The transpose of group_cast: each output split adds (sum/avg) its sources' pieces to
        the values already in `output`."""
        return self._grouped(Kind.GROUP_REDUCE, output, input, splits, reduce_op(op), async_op)

    def fused_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float = 1e-6, check_replicated: bool | None = None,
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed, new_residual) = RMSNorm(all_reduce(x) + residual) (reference.py says where
        each rounding happens). cuda: the fused kernel (hiercoll.executor.cuda.fused_norm) when
        it is installed, which falls back to NCCL's all-reduce + torch's add and RMSNorm where
        the measured fit says fusion loses; otherwise all_reduce in fp32 through this
        communicator, then the reference math.

        `residual` and `weight` must be the same on every rank of the group (the replicated
        residual stream of tensor parallelism): each rank adds its own copy to the all-reduced
        sum (the 2-stage kernel shares only the sums), so a residual that differs per rank gives
        ranks different results. `check_replicated=True` (or HIERCOLL_CHECK_REPLICATED=1) compares
        a checksum of `residual` across ranks first and raises one line naming the first rank
        that differs from rank 0 (one small all-gather per call: a debugging aid)."""
        if check_replicated is None:
            check_replicated = os.environ.get("HIERCOLL_CHECK_REPLICATED", "") not in ("", "0")
        if check_replicated:
            from hiercoll.harness.identical import first_differing_rank
            other = first_differing_rank(residual, self._device, self._group)
            if other is not None:
                raise HiercollError(f"fused_add_rms_norm: residual differs between rank 0 and "
                                    f"rank {other} (it must be replicated on every rank of the "
                                    "group: pass the full residual stream, not a shard)")
        if self._symmetric:
            fused = _fused_kernel()
            if fused is not None and x.dim() >= 1 and x.shape == residual.shape:
                rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x   # the kernel: 2-D
                res = residual.reshape(-1, x.shape[-1]) if x.dim() != 2 else residual
                normed, new_res = fused(self, rows, res, weight, eps)
                return normed.view(x.shape), new_res.view(x.shape)
        x_sum = x.float().contiguous().clone()
        self.all_reduce(x_sum)
        return unfused_add_rms_norm(x_sum, residual, weight, eps)

    # ---- bookkeeping ----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Plan-cache and pool counters, and the plan each cached key runs."""
        return {"plans": {str(e.key): {"algorithm": e.algorithm, "how": e.how}
                          for e in self.plans.values()},
                "plan_hits": self.plans.hits, "plan_misses": self.plans.misses,
                "plan_evictions": self.plans.evictions,
                "pool_bytes": self.pool.capacity, "pool_allocations": self.pool.allocations,
                "signal_bytes": self.signal_pool.capacity,
                "signal_allocations": self.signal_pool.allocations,
                # comm.empty: tensors handed out, and placements whose plan runs rebased onto
                # them (no copy) or could not be rebased (backend.rebased: NCCL sends, NVSHMEM
                # puts, odd alignment); an in-place call whose kernels are unsafe so copies
                # without a placement
                "empty_tensors": len(self._user),
                "rebased_calls": sum(t is not None for _, t in self._rebased.values()),
                "copying_placements": sum(t is None for _, t in self._rebased.values())}

    def close(self) -> None:
        """Collective: every rank of the group calls it. Frees the pools and the plans."""
        if self._closed:
            return
        _patch.forget(self)
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        if self._symmetric or self._extra:
            dist.barrier(self._group)
        if self._device.type == "cuda" and (forget := _fused_forget()) is not None:
            forget(self)        # the fused kernel's state holds views of the pool freed below
        self.plans.clear()
        self._rebased.clear()
        self._user.clear()
        self.pool.close()
        self.signal_pool.close()
        self._extra.clear()
        self._closed = True

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise HiercollError("communicator: closed; make a new Communicator")

    def _bucket(self, count: int, *tensors: torch.Tensor) -> int:
        """The plan size a call of `count` elements (a rank's unit) runs at: exact where a
        tensor of the call is an empty() one (its plan runs on it, no padding, no copy), else
        rounded up to the size bucket."""
        if any(self._placement(t) is not None for t in tensors):
            return max(int(count), 1)
        return size_bucket(count, self._min_bucket)

    def _flat(self, t: torch.Tensor, name: str) -> torch.Tensor:
        self._check_open()
        if not isinstance(t, torch.Tensor):
            raise HiercollError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type != self._device.type:
            raise HiercollError(f"{name}: on {t.device}, this communicator's tensors live on "
                                f"{self._device.type}")
        if not t.is_contiguous():
            raise HiercollError(f"{name}: must be contiguous (call .contiguous() first)")
        dtype_of(t, name)
        return t.view(-1)

    @staticmethod
    def _same_dtype(a: torch.Tensor, b: torch.Tensor) -> None:
        if a.dtype != b.dtype:
            raise HiercollError(f"input: dtype {b.dtype} differs from output's {a.dtype}")

    def _generation(self) -> tuple[int, int, int]:
        return (self.pool.generation, self.signal_pool.generation, self._slot_resets)

    def _call(self, kind: Kind, like: torch.Tensor, op: ReduceOp, bucket: int, nbytes_elems: int,
              pack: Pack, unpack: Unpack, async_op: bool, user: tuple[torch.Tensor, ...],
              splits: GroupSplits | None = None, digest: str = "",
              direct: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> Work | None:
        """Plan (or reuse) and run one call. `direct`: the caller's own (input, output) and the
        call's exact element count (S as the spec counts it): where the plan is the library's
        call, it runs on them (no copy into or out of the pool, no padding to the bucket)."""
        dtype = dtype_of(like, "input")
        at = (None, None) if direct is None else (self._placement(direct[0]),
                                                   self._placement(direct[1]))
        placed = at != (None, None)
        in_place = direct is not None and placed and direct[0].data_ptr() == direct[1].data_ptr()
        key = PlanKey(kind.value, dtype.value, op.value, 0 if splits else bucket, digest, placed)

        def spec() -> CollectiveSpec:
            if splits is not None:
                return CollectiveSpec(kind=kind, world_size=self._world, dtype=dtype,
                                      reduce_op=op, splits=splits)
            return CollectiveSpec(kind=kind, world_size=self._world, dtype=dtype, reduce_op=op,
                                  nbytes=nbytes_elems * dtype.itemsize)
        entry = self._entry(key, spec, library_direct=direct is not None, in_place=in_place)
        if direct is not None and entry.schedule.meta.algorithm == LIBRARY_ALGORITHM:
            inp, out, count = direct
            return self._library_direct((kind, dtype, op, count), inp, out, async_op)
        if direct is not None and entry.pooled and not async_op and self._fits(entry, direct):
            # the plan runs on the caller's tensors, on the current stream: an LL plan reads
            # and writes them in place (no copy at all), a plan rebased onto empty() tensors
            # too, others copy in and out themselves
            prepared = self._on_user_memory(entry, direct[0], direct[1], *at) or entry.prepared
            with _patch.inside():
                entry.backend.run(prepared, direct[0], direct[1])
            return None
        return self._launch(entry, pack, unpack, async_op, user)

    def _fits(self, entry: _Entry, direct: tuple[torch.Tensor, torch.Tensor, int]) -> bool:
        """The call's tensors are exactly the plan's (no padding to the size bucket)."""
        spec = entry.schedule.spec
        return (direct[0].numel() == spec.input_count(self._rank)
                and direct[1].numel() == spec.output_count(self._rank))

    def _placement(self, t: torch.Tensor) -> Any:
        """`t` as a view of the empty() allocation it lies in (SymmetricView), or None."""
        if not self._user or not t.numel():
            return None
        from hiercoll.executor.cuda.symm import SymmetricView
        ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
        for alloc in self._user:
            base = alloc.tensor.data_ptr()
            if base <= ptr and ptr + nbytes <= base + alloc.tensor.numel():
                # torch's views keep a tensor's offset a multiple of its element size
                return SymmetricView(alloc, ptr - base, t.numel(), t.dtype)
        return None

    def _on_user_memory(self, entry: _Entry, inp: torch.Tensor, out: torch.Tensor,
                        at_in: Any, at_out: Any) -> Any:
        """The entry's call rebased onto the caller's empty() tensors (`at_*`: their
        placements, `_placement`; backend.rebased), made once per placement; None where they
        are not empty() tensors or it cannot (then the call copies). One tensor as input and
        output only where the kernels are safe in place."""
        if at_in is None and at_out is None:
            return None
        prepared: Any = entry.prepared           # a CudaPrepared: the entry is pooled
        same = inp.data_ptr() == out.data_ptr()
        lo, hi = sorted(((inp.data_ptr(), inp.numel() * inp.element_size()),
                         (out.data_ptr(), out.numel() * out.element_size())))
        if (same and not prepared.in_place_ok) or (not same and lo[0] + lo[1] > hi[0]):
            return None

        def where(at: Any) -> tuple[int, int] | None:
            return None if at is None else (id(at.parent), at.byte_offset)
        key = (entry.key, where(at_in), where(at_out))
        hit = self._rebased.get(key)
        if hit is not None and hit[0] is prepared:
            return hit[1]
        from hiercoll.executor.cuda.backend import rebased
        if len(self._rebased) >= 64:
            self._rebased.clear()
        twin = rebased(prepared, at_in, at_out)
        self._rebased[key] = (prepared, twin)
        return twin

    def _library_direct(self, key: tuple[Kind, DType, ReduceOp, int], inp: torch.Tensor,
                        out: torch.Tensor, async_op: bool) -> Work | None:
        """The library's collective on the caller's tensors, on the current stream (as the
        caller would call torch.distributed): what a library pick costs is the library's call.
        `key`: (kind, dtype, op, S in elements); its call is lowered once (a spec is validated
        only on a miss: this is every call's path)."""
        call = self._direct_calls.get(key)
        if call is None:
            if len(self._direct_calls) >= 256:
                self._direct_calls.clear()
            kind, dtype, op, count = key
            spec = CollectiveSpec(kind=kind, world_size=self._world, dtype=dtype, reduce_op=op,
                                  nbytes=count * dtype.itemsize)
            call = self._direct_calls[key] = library_call(spec, self._group)
        with _patch.inside():
            call(inp, out)
        if not async_op:
            return None
        if self._stream is None:
            return Work()
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self._device))
        return Work(done)

    def _entry(self, key: PlanKey, make_spec: Callable[[], CollectiveSpec],
               library_direct: bool = False, in_place: bool = False) -> _Entry:
        """The prepared plan for `key`, made on a miss. `key.placed`: the call's tensors are
        comm.empty ones (a plan then copies nothing, unless `in_place` and its kernels are not
        safe so), which decides whether the library's call beats the plan with its copies."""
        entry = self.plans.get(key)
        if entry is not None and (not entry.pooled or entry.generation == self._generation()):
            return entry
        if self._device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise HiercollError(f"communicator: no prepared plan for {key} during CUDA-graph "
                                "capture; call it once with this size before capturing")
        spec = make_spec()
        measured: tuple[float | None, float | None] = (None, None)   # (the pick, NCCL's call)
        if entry is not None:         # stale (pools grew, slots reset): its plan stands
            schedule, how, executor = entry.schedule, entry.how, entry.executor
        else:
            chosen = plan_with(self._topology, spec, self._algorithm, tuning=self._tuning)
            schedule, how, executor = chosen.schedule, chosen.how, chosen.executor
            measured = (chosen.measured_us, chosen.library_us)
        choice = self._choice.with_tuning(executor)
        name = choice.for_schedule(schedule)
        opts = choice.options("eager") if name == choice.name else {}   # a library call: none
        if name == BackendName.CUDA and library_beats_staged(
                *measured, spec.input_count(self._rank) * spec.dtype.itemsize,
                self._copies_nothing(schedule, CudaOptions(**opts), key.placed, in_place)):
            # measured faster than NCCL on its own buffers, slower with our copies added
            schedule = library_schedule(self._topology, spec)
            how, executor = f"{how}; the library (faster than the plan with its copies)", {}
            name, opts = choice.for_schedule(schedule), {}
        backend_key = (name, tuple(sorted(opts.items())))
        backend = self._backends.get(backend_key)
        if backend is None:
            backend = self._backends[backend_key] = get_backend(name.value, **opts)
        pooled = name == BackendName.CUDA
        if pooled:
            prepared = backend.prepare(schedule, self._group,   # type: ignore[call-arg]
                                       buffers=self._cuda_buffers)
        else:
            if not (library_direct and schedule.meta.algorithm == LIBRARY_ALGORITHM):
                self._reserve_staging(spec)      # a direct library call stages nothing
            prepared = backend.prepare(schedule, self._group)
        entry = _Entry(key, schedule, how, executor, backend, prepared, pooled, self._generation())
        self.plans.put(key, entry)
        return entry

    @staticmethod
    def _copies_nothing(schedule: Schedule, opts: CudaOptions, placed: bool,
                        in_place: bool) -> bool:
        """A call of `schedule` adds no copies: an LL plan (any tensor), or comm.empty tensors
        the plan is rebased onto (one tensor only where the kernels are safe in place)."""
        if ll_applies(schedule, opts) is not None:
            return True
        return placed and (not in_place or runs_in_place(schedule, opts))

    def _reserve_staging(self, spec: CollectiveSpec) -> None:
        isz = spec.dtype.itemsize
        self.pool.reserve(align(spec.input_count(self._rank) * isz)
                          + spec.output_count(self._rank) * isz)

    def _cuda_buffers(self, numel: int, dtype: torch.dtype, slots: int) -> tuple[Any, Any]:
        """A cuda plan's data (offset 0 of the pool: calls run one at a time) and its own zeroed
        signal range (plans cannot share slots: each counts calls with its own epoch)."""
        isz = torch.empty((), dtype=dtype).element_size()
        self.pool.reserve(numel * isz)
        offset = self._slots.take(slots)
        if offset is None:
            live = sum(align(4 * _slots_of(e)) for e in self.plans.values() if e.pooled)
            live += align(4 * slots)
            torch.cuda.synchronize(self._device)     # no queued call still signals
            if live > self.signal_pool.capacity:
                self.signal_pool.reserve(max(live, 2 * self.signal_pool.capacity))
            self._slots.reset()
            self._slot_resets += 1                   # every older cuda plan re-prepares
            offset = self._slots.take(slots)
            assert offset is not None
        data = self.pool.symmetric_view(0, numel, dtype)
        signals = self.signal_pool.symmetric_view(offset, slots, torch.int32)
        return data, signals

    def _views(self, entry: _Entry) -> tuple[torch.Tensor, torch.Tensor]:
        spec, rank = entry.schedule.spec, self._rank
        if entry.pooled:
            p: Any = entry.prepared
            return p.input_view, p.output_view
        dtype = torch_dtype(spec.dtype)
        n_in, n_out = spec.input_count(rank), spec.output_count(rank)
        return (self.pool.typed(0, n_in, dtype),
                self.pool.typed(align(n_in * spec.dtype.itemsize), n_out, dtype))

    def _launch(self, entry: _Entry, pack: Pack, unpack: Unpack, async_op: bool,
                user: tuple[torch.Tensor, ...]) -> Work | None:
        with _patch.inside():
            if self._stream is None:
                inp, out = self._views(entry)
                pack(inp, out)
                entry.backend.run(entry.prepared, inp, out)
                unpack(out)
                return Work() if async_op else None
            current = torch.cuda.current_stream(self._device)
            self._stream.wait_stream(current)
            with torch.cuda.stream(self._stream):
                inp, out = self._views(entry)
                pack(inp, out)
                entry.backend.run(entry.prepared, inp, out)
                unpack(out)
            if not torch.cuda.is_current_stream_capturing():
                for t in user:
                    t.record_stream(self._stream)
            done = torch.cuda.Event()
            done.record(self._stream)
            if async_op:
                return Work(done)
            current.wait_event(done)
            return None

    def _grouped(self, kind: Kind, output: torch.Tensor, input: torch.Tensor,
                 splits: GroupSplits | dict[str, Any], op: ReduceOp,
                 async_op: bool) -> Work | None:
        out_flat, in_flat = self._flat(output, "output"), self._flat(input, "input")
        self._same_dtype(out_flat, in_flat)
        gs = splits if isinstance(splits, GroupSplits) else GroupSplits.model_validate(splits)
        dtype = dtype_of(in_flat, "input")
        try:
            spec = CollectiveSpec(kind=kind, world_size=self._world, dtype=dtype, reduce_op=op,
                                  splits=gs)
        except ValueError as exc:
            raise HiercollError(f"splits: {str(exc).splitlines()[-1].strip()}") from None
        n_in, n_out = spec.input_count(self._rank), spec.output_count(self._rank)
        if in_flat.numel() != n_in or out_flat.numel() != n_out:
            raise HiercollError(f"input/output: {in_flat.numel()}/{out_flat.numel()} elements, "
                                f"this rank's splits need {n_in}/{n_out}")
        digest = hashlib.sha256(gs.model_dump_json().encode()).hexdigest()
        accumulate = kind == Kind.GROUP_REDUCE

        def pack(inp: torch.Tensor, out: torch.Tensor) -> None:
            inp.copy_(in_flat)
            if accumulate:
                out.copy_(out_flat)

        def unpack(out: torch.Tensor) -> None:
            out_flat.copy_(out)
        return self._call(kind, in_flat, op, 0, 0, pack, unpack, async_op, (output, input),
                          splits=gs, digest=digest)

    def _all_to_all_v(self, output: torch.Tensor, input: torch.Tensor,
                      out_sizes: list[int] | None, in_sizes: list[int] | None,
                      async_op: bool) -> Work | None:
        """Split sizes (rows of dim 0, as torch counts them) -> every rank's -> a group_cast."""
        w = self._world
        rows_in = input.shape[0] if input.dim() else 1
        row = input.numel() // max(rows_in, 1)
        ins = list(in_sizes) if in_sizes is not None else [rows_in // w] * w
        outs = list(out_sizes) if out_sizes is not None else [output.shape[0] // w] * w
        if len(ins) != w or len(outs) != w or min(ins + outs, default=0) < 0:
            raise HiercollError(f"input_split_sizes/output_split_sizes: need {w} sizes >= 0 each")
        if sum(ins) * row != input.numel() or sum(outs) * row != output.numel():
            raise HiercollError("input_split_sizes/output_split_sizes: they do not add up to the "
                                "tensors' first dimension")
        mine = torch.tensor(ins, dtype=torch.int64, device=self._device)
        every = torch.empty(w * w, dtype=torch.int64, device=self._device)
        with _patch.inside():
            all_gather_single(every, mine, group=self._group)
        table = every.view(w, w).tolist()           # table[src][dst] rows
        if [table[s][self._rank] for s in range(w)] != outs:
            raise HiercollError(f"output_split_sizes: {outs} but the ranks send "
                                f"{[table[s][self._rank] for s in range(w)]}")
        ranks = [{"input": [{"size": table[r][d] * row, "peers": [d]} for d in range(w)],
                  "output": [{"size": table[s][r] * row, "peers": [s]} for s in range(w)]}
                 for r in range(w)]
        return self.group_cast(output, input, GroupSplits.model_validate({"ranks": ranks}),
                               async_op)


def _slots_of(entry: _Entry) -> int:
    prepared: Any = entry.prepared            # a CudaPrepared
    return int(prepared.program.num_slots)


def _fused_kernel() -> Callable[..., Any] | None:
    """The fused all-reduce + add + RMSNorm kernel's entry point, if this install has it."""
    return _fused_attr("fused_add_rms_norm")


def _fused_forget() -> Callable[..., Any] | None:
    """The fused kernel's `forget(ctx)`: drops the per-communicator state it caches."""
    return _fused_attr("forget")


def _fused_attr(name: str) -> Callable[..., Any] | None:
    import importlib
    try:
        module = importlib.import_module("hiercoll.executor.cuda.fused_norm")
    except ImportError:
        return None
    fn: Callable[..., Any] | None = getattr(module, name, None)
    return fn


def patch(*comms: Communicator) -> Communicator | None:
    """Route torch.distributed's collectives through `comms` (hiercoll.torch.patching); with
    none, a Communicator() for WORLD is made (collective), registered and returned."""
    made = None
    if not comms:
        made = Communicator()
        comms = (made,)
    _patch.install(*comms)
    return made
