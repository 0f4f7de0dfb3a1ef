"""The cuda backend runtime: symmetric allocations, the encoded row table, streams, launches.

`prepare` lowers the schedule (lowering.py), allocates one symmetric data allocation and one
signal allocation (same order on every rank, never freed), encodes the rows and resolves the
copy-engine peer views. `run` is capturable into a CUDA graph: it only enqueues work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist

from hiercoll.errors import HiercollError, VerificationError
from hiercoll.executor.cuda.kernel_trace import err_words, trace_enabled
from hiercoll.executor.cuda.lowering import (
    Addr,
    CallStep,
    CopyLaunch,
    CudaOptions,
    InterTransport,
    KernelLaunch,
    PutLaunch,
    RankProgram,
    RecvLaunch,
    SendLaunch,
    call_steps,
    fused_launch,
    launch_label,
    lower,
    put_chunk_bytes,
    put_launches,
    runs_in_place,
    spin_limit_for,
    warm_slot,
)
from hiercoll.executor.cuda.nccl_p2p import DirectNccl, direct_nccl
from hiercoll.executor.cuda.symm import SymmetricBuffer, allocate, deltas, use_nvshmem
from hiercoll.executor.cuda.table import Moved, Table, encode
from hiercoll.executor.interface import BackendName, Prepared, RunResult, check_launch, check_tensor
from hiercoll.executor.torch_dtypes import torch_dtype
from hiercoll.kernels.abi import F_NWAIT, ROW_WORDS
from hiercoll.schedule import INPUT, OUTPUT, Schedule

if TYPE_CHECKING:
    from hiercoll.kernels.program import BoundLaunch, KernelState



@dataclass
class _Copy:
    dst: torch.Tensor
    src: torch.Tensor


@dataclass
class _Put:
    """A PutLaunch's kernel arguments: local symmetric addresses (NVSHMEM maps them to the
    peer's), the 64-bit signal slots' addresses and their PEs (global ranks)."""

    dst: int
    src: int
    nbytes: int
    chunk: int
    sigs: torch.Tensor      # int64 addresses, the receiver's first
    pes: torch.Tensor       # int32
    grid: int
    sig: torch.Tensor       # this rank's int32 slots, which the put's waits read
    waits: torch.Tensor     # int64 (slot, per_epoch | wide << 32) pairs: the table's wait format
    n_wait: int
    epoch: torch.Tensor     # the kernels' call counter (KernelState.epoch)
    err: torch.Tensor       # the debug-timeout record (KernelState.err)
    spin_limit: int
    row: int                # what a timeout records as its row: -1 - its `put_launches` index


class CallFacts(NamedTuple):
    """A prepared call's fixed facts (`CudaPrepared.facts`)."""

    in_count: int
    out_count: int
    dtype: torch.dtype
    in_ptr: int            # the symmetric input's address (a caller passing it copies nothing)
    out_ptr: int
    base_ptr: int          # the data allocation's, which the kernel's deltas count from


@dataclass(kw_only=True)
class CudaPrepared(Prepared):
    """A rank's prepared call: everything `enqueue` needs, all present once built."""

    program: RankProgram
    data: SymmetricBuffer
    signals: SymmetricBuffer
    table: Table
    kernel: KernelState              # the device tensors every launch reads
    streams: dict[int, torch.cuda.Stream]     # channel -> stream (none for a fused program)
    copies: dict[int, _Copy]                  # id(CopyLaunch) -> views
    net_stream: torch.cuda.Stream | None      # only with NCCL or NVSHMEM inter-node ops
    net_views: dict[int, torch.Tensor]        # id(Send/Recv) -> view
    puts: dict[int, _Put] = field(default_factory=dict)   # id(PutLaunch) -> its arguments
    spin_limit: int
    reduce_op: str
    bound: dict[int, BoundLaunch] = field(default_factory=dict)   # id(KernelLaunch) -> launch
    mixed_channels: frozenset[int] = frozenset()   # channels with copies or puts, not only kernels
    # the only channel, all kernels, no net stream: its launches go on the main stream (stream
    # order is the same; the fork and join, two cross-stream waits, cost host time per call)
    inline_channel: int | None = None
    group: Any = None                         # the process group (None: WORLD)
    # INPUT/OUTPUT -> the caller's symmetric tensor the region lives in (`rebased`); else the
    # region is in `data`
    placed: dict[str, torch.Tensor] = field(default_factory=dict)
    options: CudaOptions = field(default_factory=CudaOptions)    # what it was lowered with
    nccl: DirectNccl | None = None   # sends/receives through NCCL itself (nccl_p2p.py), not torch

    @functools.cached_property
    def in_place_ok(self) -> bool:
        """Whether a call may pass one tensor as input and output with no copies between
        (lowering.runs_in_place on what this rank's kernels run)."""
        return runs_in_place(self.schedule, self.options)

    @functools.cached_property
    def facts(self) -> CallFacts:
        """What every call checks its tensors against, computed once: an eager call is host-bound
        below a few MiB, and these cost a microsecond or two each per call (shape sums, dtype
        conversion, data pointers of views; bench/gpu/host_profile.py)."""
        spec = self.schedule.spec
        return CallFacts(spec.input_count(self.rank), spec.output_count(self.rank),
                         torch_dtype(spec.dtype), self.input_view.data_ptr(),
                         self.output_view.data_ptr(), self.kernel.data.data_ptr())

    @functools.cached_property
    def input_view(self) -> torch.Tensor:
        """The symmetric input: write here directly to skip the copy-in."""
        return self._view(INPUT)

    @functools.cached_property
    def output_view(self) -> torch.Tensor:
        return self._view(OUTPUT)

    def _view(self, name: str) -> torch.Tensor:
        off = self.program.layout.offsets[name]
        spec = self.schedule.spec
        n = spec.input_count(self.rank) if name == INPUT else spec.output_count(self.rank)
        if name in self.placed:
            return self.placed[name][:n]
        return self.data.tensor[off:off + n]


class CudaBackend:
    name = BackendName.CUDA

    def __init__(self, **options: Any) -> None:
        self.options = CudaOptions(**options)

    def prepare(self, schedule: Schedule, group: Any = None,
                buffers: BufferSource | None = None) -> CudaPrepared:
        """Collective over `group` (WORLD or a subgroup; ranks are the group's). `buffers`:
        where the data and signal arrays come from (hiercoll.torch's pool); default: two new
        symmetric allocations, kept for the life of the process. Signals handed in must be
        zero (slots count up from 0 with the plan's epoch)."""
        if group is not None and group == dist.group.WORLD:
            group = None
        world = dist.get_world_size(group)
        check_launch(schedule, world)
        rank = dist.get_rank(group)
        device = torch.device("cuda", torch.cuda.current_device())
        if self.options.inter_transport == InterTransport.NVSHMEM:
            use_nvshmem(device)       # before the allocations (the pool's owner did it earlier)
        options = fit_to_device(self.options, device, group)
        program = lower(schedule, rank, options)
        dtype = torch_dtype(schedule.spec.dtype)
        if buffers is None:
            data: SymmetricBuffer = allocate(program.layout.total, dtype, device, group)
            signals: SymmetricBuffer = allocate(program.num_slots, torch.int32, device, group)
        else:
            data, signals = buffers(program.layout.total, dtype, program.num_slots)
        prepared = build_prepared(schedule, program, data, signals, world, options, device,
                                  group)
        torch.cuda.synchronize()
        dist.barrier(group)
        return prepared

    def run(self, prepared: Prepared, input: torch.Tensor, output: torch.Tensor) -> RunResult:
        assert isinstance(prepared, CudaPrepared)
        refuse_nccl_capture(bool(prepared.net_views), torch.cuda.is_current_stream_capturing())
        enqueue(prepared, input, output, self.net_hook)
        if prepared.spin_limit and not torch.cuda.is_current_stream_capturing():
            check_timeouts(prepared)
        return RunResult(self.name, prepared.rank, output)

    @staticmethod
    def net_hook(prepared: CudaPrepared, main: torch.cuda.Stream) -> None:
        """The net stream: wait rows, NCCL sends/receives in the global order, signal rows; or
        (NVSHMEM) this rank's puts, each waiting in its own kernel."""
        assert prepared.net_stream is not None
        net = prepared.net_stream
        net.wait_stream(main)
        with torch.cuda.stream(net):
            for item in prepared.program.net:
                if isinstance(item, KernelLaunch):
                    _kernel(prepared, item, net)
                elif isinstance(item, PutLaunch):
                    _put(prepared.puts[id(item)])
                elif prepared.nccl is not None and isinstance(item, SendLaunch):
                    prepared.nccl.send(prepared.net_views[id(item)], item.peer, net)
                elif prepared.nccl is not None and isinstance(item, RecvLaunch):
                    prepared.nccl.recv(prepared.net_views[id(item)], item.peer, net)
                elif isinstance(item, SendLaunch):
                    _wait(dist.isend(prepared.net_views[id(item)],
                                     _global_rank(prepared.group, item.peer), prepared.group))
                elif isinstance(item, RecvLaunch):
                    _wait(dist.irecv(prepared.net_views[id(item)],
                                     _global_rank(prepared.group, item.peer), prepared.group))
        main.wait_stream(net)


def fit_to_device(options: CudaOptions, device: torch.device, group: Any = None) -> CudaOptions:
    """`options` with the auto grid capped at the group's smallest GPU's SMs (collective: the
    ranks' lowerings must agree on the grid, or their barrier counts disagree and the call
    hangs). The row kernel takes one CTA an SM (its registers), and every CTA of a launch must
    be resident at once: they spin on each other."""
    where = "cpu" if dist.get_backend(group) == "gloo" else device   # NCCL takes device tensors
    t = torch.tensor([torch.cuda.get_device_properties(device).multi_processor_count],
                     dtype=torch.int64, device=where)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    sms = int(t.item())
    return replace(options, max_ctas=sms) if options.max_ctas > sms else options


def refuse_nccl_capture(sends_or_receives: bool, capturing: bool) -> None:
    """NCCL send/recv on the net stream cannot be captured: in a CUDA graph the net stream is a
    sibling branch of the main one, which CUDA may run after it while each waits on the other
    (the first `--inter-transport nccl` graph case on 4 x H200 hung, 2026-11-27). The NVSHMEM
    transport moves its puts inline for graphs; NCCL's would need the same, unbuilt."""
    if sends_or_receives and capturing:
        raise HiercollError("--inter-transport nccl: its send/recv cannot run inside a CUDA graph "
                            "(a sibling graph branch: it hung on 4 x H200); run it eager, or use "
                            "--inter-transport nvshmem or peer in graph mode")


class LaunchTimer:
    """CUDA events around every launch and copy of a call (`enqueue(..., timer=...)`): the
    measured per-op timeline `hiercoll run --profile` writes (with `launch_per_op`, one launch
    is one op). Eager only: events are recorded from the host."""

    def __init__(self) -> None:
        self.start = torch.cuda.Event(enable_timing=True)
        self.spans: list[tuple[str, int, torch.cuda.Event, torch.cuda.Event]] = []

    def around(self, label: str, channel: int, launch: Callable[[], None]) -> None:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        launch()
        end.record()
        self.spans.append((label, channel, begin, end))

    def times_us(self, reference: torch.cuda.Event | None = None,
                 ) -> list[tuple[str, int, float, float]]:
        """(label, channel, start, end) in microseconds from `reference` (default: this rank's
        call start; one-GPU runs pass one event recorded before every rank's call)."""
        torch.cuda.synchronize()
        ref = reference or self.start
        return [(label, ch, ref.elapsed_time(b) * 1e3, ref.elapsed_time(e) * 1e3)
                for label, ch, b, e in self.spans]


def _global_rank(group: Any, group_rank: int) -> int:
    """send/recv name peers by global rank; plans name them by rank in the group."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _wait(work: Any) -> None:
    """A point-to-point request: torch returns None where there was nothing to wait for."""
    if work is not None:
        work.wait()


NetHook = Callable[[CudaPrepared, torch.cuda.Stream], None]
# (data elements, data dtype, signal slots) -> (data, signals): a caller-owned allocation
BufferSource = Callable[[int, torch.dtype, int], tuple[SymmetricBuffer, SymmetricBuffer]]


def build_prepared(schedule: Schedule, program: RankProgram, data: SymmetricBuffer,
                   signals: SymmetricBuffer, world: int, options: CudaOptions,
                   device: torch.device, group: Any = None) -> CudaPrepared:
    """Everything after the allocations: the row table on the device, streams, copy-engine views,
    net views, and the kernels compiled (so no rank sits in the JIT while its peers spin)."""
    from hiercoll.kernels.program import KernelState
    rank = program.rank
    dtype = torch_dtype(schedule.spec.dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    table = encode(program, deltas(data, rank, itemsize), deltas(signals, rank, 4))
    trace = trace_enabled()
    kernel = KernelState(table=torch.tensor(table.words, dtype=torch.int64, device=device),
                         data=data.tensor, sig=signals.tensor,
                         # LL programs keep one counter per CTA after the first (kernels/ll.py)
                         epoch=torch.zeros(1 + (_grid(program) if program.ll_half else 0),
                                           dtype=torch.int32, device=device),
                         err=torch.zeros(err_words(trace), dtype=torch.int64, device=device),
                         trace=trace, ll_half=program.ll_half,
                         in_delta=program.layout.offsets[INPUT],
                         out_delta=program.layout.offsets[OUTPUT])
    copies = _copy_views(program, lambda a, n: data.peer_view(a.rank, a.offset, n))
    net_views: dict[int, torch.Tensor] = {}
    for item in program.net:
        if isinstance(item, SendLaunch):
            net_views[id(item)] = data.tensor[item.src.offset:item.src.offset + item.count]
        elif isinstance(item, RecvLaunch):
            net_views[id(item)] = data.tensor[item.dst.offset:item.dst.offset + item.count]
    spin_limit = spin_limit_for(options.debug_timeout_ms)
    puts = {id(item): _put_args(item, data, signals, itemsize, device, group, kernel, spin_limit,
                                -1 - i)
            for i, item in enumerate(put_launches(program))}
    notes = list(program.notes)
    sends = sum(isinstance(x, SendLaunch) for x in program.net)
    if sends:
        notes.append(f"{sends} inter-node sends through NCCL send/recv")
    notes.append(f"grid {_grid(program)} CTAs; {sum(map(len, program.streams.values()))}"
                 f" launches on {len(program.streams)} stream(s); {len(copies)} copy-engine copies")
    prepared = CudaPrepared(
        schedule, rank, world, BackendName.CUDA, notes, program=program, data=data,
        signals=signals, table=table, kernel=kernel,
        streams={} if program.fused else {ch: torch.cuda.Stream(device=device)
                                          for ch in program.streams},
        copies=copies,
        net_stream=torch.cuda.Stream(device=device) if program.net else None,
        net_views=net_views,
        puts=puts,
        group=group,
        options=options,
        spin_limit=spin_limit,
        reduce_op=schedule.spec.reduce_op.value,
        mixed_channels=frozenset(ch for ch, items in program.streams.items()
                                 if any(isinstance(x, (CopyLaunch, PutLaunch)) for x in items)))
    if not program.fused and len(program.streams) == 1 and not prepared.mixed_channels \
            and not program.net:
        (prepared.inline_channel,) = program.streams
    if puts:
        _warm_up_put(program, data, signals, kernel, device, group)
    if any(isinstance(x, (SendLaunch, RecvLaunch)) for x in program.net):
        prepared.nccl = direct_nccl(group, device)
        _warm_up_net(program, device, group, prepared.nccl)
    _bind(prepared)
    return prepared


def _copy_views(program: RankProgram, view: Callable[[Addr, int], torch.Tensor]
                ) -> dict[int, _Copy]:
    """id(CopyLaunch) -> the (dst, src) tensors its copy-engine copy moves between."""
    return {id(item): _Copy(view(item.dst, item.count), view(item.src, item.count))
            for items in program.streams.values() for item in items
            if isinstance(item, CopyLaunch)}


def _bind(prepared: CudaPrepared) -> None:
    """Compile every kernel variant the call launches and bind each launch to its rows."""
    from hiercoll.kernels.program import bind_launch, warm_up
    kernel, table = prepared.kernel, prepared.table
    launches = [(launch, table.launches[id(launch)], bump, fused)
                for launch, bump, fused in _kernel_launches(prepared.program)]
    compiled = warm_up(kernel, prepared.reduce_op, prepared.spin_limit,
                       {(span.aligned, bump, fused, span.also) for _, span, bump, fused in launches})
    for launch, span, bump, fused in launches:
        bound = bind_launch(kernel, span, compiled, reduce_op=prepared.reduce_op,
                            spin_limit=prepared.spin_limit, bump_epoch=bump, fused=fused)
        if bound is not None:
            prepared.bound[id(launch)] = bound


def rebased(prepared: CudaPrepared, input_at: SymmetricBuffer | None,
            output_at: SymmetricBuffer | None) -> CudaPrepared | None:
    """`prepared` with its input and/or output living in the caller's symmetric tensors
    (`*_at`: element 0 is the region's first; the same allocation and offset on every rank),
    so a call copies nothing in or out: peers' rows read and write the caller's memory. Local
    work only (no collective): every rank must ask with the same placements. Shares the call
    counter, signals, scratch and streams with `prepared` (calls of either run one after the
    other on one stream, as calls of one plan do). Both at one tensor (in place) only where the
    caller checked `lowering.runs_in_place`.

    None where it cannot: an LL program (it runs on any tensor already: `zero_copy_io`), NVSHMEM
    puts or NCCL sends (their views and warm-ups are bound to the data allocation), or a
    placement not 16-byte aligned (the rows' vector width assumes the layout's alignment)."""
    p = prepared.program
    if p.ll_half or prepared.puts or p.net:
        return None
    isz = prepared.data.tensor.element_size()
    mine = prepared.data.base_ptrs[prepared.rank]
    regions: list[tuple[int, int, SymmetricBuffer]] = []
    moved: list[Moved] = []
    placed: dict[str, torch.Tensor] = {}
    for name, at in ((INPUT, input_at), (OUTPUT, output_at)):
        if at is None:
            continue
        if any(b % 16 for b in at.base_ptrs):
            return None
        start, size = p.layout.offsets[name], p.layout.sizes.get(name, 0)
        regions.append((start, size, at))
        moved.append(Moved(start, size, tuple((b - mine) // isz for b in at.base_ptrs)))
        placed[name] = at.tensor

    def view(a: Addr, n: int) -> torch.Tensor:
        for start, size, at in regions:
            if start <= a.offset < start + size:
                return at.peer_view(a.rank, a.offset - start, n)
        return prepared.data.peer_view(a.rank, a.offset, n)
    table = encode(p, deltas(prepared.data, prepared.rank, isz),
                   deltas(prepared.signals, prepared.rank, 4), tuple(moved))
    kernel = replace(prepared.kernel, table=torch.tensor(table.words, dtype=torch.int64,
                                                         device=prepared.kernel.table.device))
    out = replace(prepared, table=table, kernel=kernel, copies=_copy_views(p, view), bound={},
                  placed=placed)
    _bind(out)
    return out


def _kernel_launches(program: RankProgram) -> list[tuple[KernelLaunch, bool, bool]]:
    """Every kernel launch of a call, with how `enqueue` launches it (bump_epoch, fused)."""
    if program.fused:
        return [(fused_launch(program), False, True)]
    out = [(x, False, False) for items in (*program.streams.values(), program.net)
           for x in items if isinstance(x, KernelLaunch)]
    if program.start_barrier is not None:
        out.append((program.start_barrier, True, False))
    return [*out, (program.end_barrier, False, False)]


def enqueue(prepared: CudaPrepared, input: torch.Tensor, output: torch.Tensor,
            net: NetHook | None = None, timer: LaunchTimer | None = None,
            main: torch.cuda.Stream | None = None) -> None:
    """Enqueue one call on the current stream (`main`, when the caller has it at hand), step by
    step of the call protocol (`lowering.call_steps`); channel streams fork from it and join
    back. Only enqueues: capturable into a CUDA graph."""
    p, f = prepared.program, prepared.facts
    check_tensor("input", input, f.in_count, f.dtype, "cuda")
    check_tensor("output", output, f.out_count, f.dtype, "cuda")
    if main is None:
        main = torch.cuda.current_stream()
    inline = prepared.inline_channel if timer is None else None
    sym_in, sym_out = prepared.input_view, prepared.output_view
    if timer is not None:
        timer.start.record()
    # an LL program may run on the caller's own tensors: its kernel is based there, and the
    # copies in and out have nothing to do
    io = zero_copy_io(prepared, input, output)
    for step in call_steps(p):
        if step in (CallStep.COPY_IN, CallStep.COPY_OUT) and io is not None:
            continue
        if step == CallStep.COPY_IN:
            if input.data_ptr() != f.in_ptr and f.in_count:
                sym_in.copy_(input)
            if p.copy_in_output and output.data_ptr() != f.out_ptr and f.out_count:
                sym_out.copy_(output)
        elif step == CallStep.EPOCH:
            prepared.kernel.epoch.add_(1)
        elif step == CallStep.START_BARRIER:
            assert p.start_barrier is not None
            _kernel(prepared, p.start_barrier, main, bump_epoch=True, timer=timer)
        elif step == CallStep.FUSED:
            _kernel(prepared, fused_launch(p), main, fused=True, timer=timer, io=io)
        elif step == CallStep.FORK and inline is not None:
            for item in p.streams[inline]:
                assert isinstance(item, KernelLaunch)
                _kernel(prepared, item, main, channel=inline)
        elif step == CallStep.FORK:
            _fork(prepared, main, net, timer)
        elif step == CallStep.JOIN and inline is None:
            for stream in prepared.streams.values():
                main.wait_stream(stream)
        elif step == CallStep.END_BARRIER:
            _kernel(prepared, p.end_barrier, main, timer=timer)
        elif step == CallStep.COPY_OUT:
            if output.data_ptr() != f.out_ptr and f.out_count:
                output.copy_(sym_out)


def zero_copy_io(prepared: CudaPrepared, input: torch.Tensor,
                 output: torch.Tensor) -> tuple[int, int] | None:
    """(in_delta, out_delta) that let an LL program read `input` and write `output` where they
    are (elements from the data allocation), or None: the call copies through the symmetric
    buffers. Why it may: in an LL program no peer reads this rank's input or writes its output
    (ll.py). Not where the caller's tensors are the symmetric buffers already, where a word would
    straddle (4-byte alignment), or where they overlap and the plan is not safe in place."""
    p = prepared.program
    if not p.ll_half:
        return None
    f = prepared.facts
    a0, b0 = input.data_ptr(), output.data_ptr()
    if a0 == f.in_ptr and b0 == f.out_ptr:
        return None
    na, nb, isz = input.numel(), output.numel(), input.element_size()
    if (na and a0 % 4) or (nb and b0 % 4):
        return None
    a1, b1 = a0 + na * isz, b0 + nb * isz
    if a0 < b1 and b0 < a1 and not (a0 == b0 and p.ll_in_place):
        return None
    return (a0 - f.base_ptr) // isz, (b0 - f.base_ptr) // isz


def _fork(prepared: CudaPrepared, main: torch.cuda.Stream, net: NetHook | None,
          timer: LaunchTimer | None = None) -> None:
    """The channel streams, each forked from `main`, with their launches and copies; then the
    net stream (which joins itself back)."""
    for ch, items in prepared.program.streams.items():
        stream = prepared.streams[ch]
        stream.wait_stream(main)
        if timer is None and ch not in prepared.mixed_channels:
            for item in items:        # launches name their stream: no stream switch
                assert isinstance(item, KernelLaunch)
                _kernel(prepared, item, stream, channel=ch)
            continue
        with torch.cuda.stream(stream):   # copies and timer events go to the current stream
            for item in items:
                if isinstance(item, KernelLaunch):
                    _kernel(prepared, item, stream, timer=timer, channel=ch)
                elif isinstance(item, CopyLaunch):
                    copy = functools.partial(_copy, prepared.copies[id(item)])
                    if timer is None:
                        copy()
                    else:
                        timer.around(launch_label(item), ch, copy)
                elif isinstance(item, PutLaunch):
                    put = functools.partial(_put, prepared.puts[id(item)])
                    if timer is None:
                        put()
                    else:
                        timer.around(item.op, ch, put)
    if prepared.net_stream is not None:
        if net is None:
            raise HiercollError("cuda backend: this program moves inter-node copies on a net "
                                "stream (NCCL or NVSHMEM transport) but runs without a process "
                                "group")
        net(prepared, main)


def _copy(c: _Copy) -> None:
    c.dst.copy_(c.src, non_blocking=True)


def _put_args(item: PutLaunch, data: SymmetricBuffer, signals: SymmetricBuffer, itemsize: int,
              device: torch.device, group: Any, kernel: KernelState, spin_limit: int,
              row: int) -> _Put:
    base, sig = data.tensor.data_ptr(), signals.tensor.data_ptr()
    nbytes = item.count * itemsize
    # the signal word is 64-bit: an odd slot would straddle two int32 slots' 8-byte word
    if any((sig + 4 * s.slot) % 8 for s in item.signals):
        raise HiercollError(f"nvshmem put {item.op}: its signal slot is not 8-byte aligned "
                            "(the signal allocation must start on an 8-byte boundary)")
    waits = [x for w in item.waits for x in (w.slot, w.word)]
    return _Put(base + item.dst.offset * itemsize, base + item.src.offset * itemsize, nbytes,
                put_chunk_bytes(nbytes, item.ctas),
                torch.tensor([sig + 4 * s.slot for s in item.signals], dtype=torch.int64,
                             device=device),
                torch.tensor([_global_rank(group, s.rank) for s in item.signals],
                             dtype=torch.int32, device=device),
                item.ctas, signals.tensor,
                torch.tensor(waits or [0, 0], dtype=torch.int64, device=device),
                len(item.waits), kernel.epoch, kernel.err, spin_limit, row)


def _warm_up_put(program: RankProgram, data: SymmetricBuffer, signals: SymmetricBuffer,
                 kernel: KernelState, device: torch.device, group: Any) -> None:
    """Build the put kernel (and register it with NVSHMEM) before any call: one zero-byte put to
    this rank's own warm-up slot, which nothing waits on (and no waits)."""
    me = _global_rank(group, program.rank)
    sig = signals.tensor.data_ptr() + 4 * warm_slot(program)
    base = data.tensor.data_ptr()
    _put(_Put(base, base, 0, 16, torch.tensor([sig], dtype=torch.int64, device=device),
              torch.tensor([me], dtype=torch.int32, device=device), 1, signals.tensor,
              torch.zeros(2, dtype=torch.int64, device=device), 0, kernel.epoch, kernel.err, 0,
              -1))
    torch.cuda.synchronize(device)


def _warm_up_net(program: RankProgram, device: torch.device, group: Any,
                 direct: DirectNccl | None = None) -> None:
    """One batched exchange of a few bytes with every net peer before any call: NCCL loads its
    send/recv kernel on first use, and CUDA's lazy module loading may wait for the device to
    go idle to load it. In a call that first use comes while this rank's row kernels spin
    waiting for the receive: on 4 x H200 every `--inter-transport nccl` call hung that way
    (its waits timed out after 4, 5 and 30 s alike, with 16 CTAs as with 120, and with 32
    stream connections: bench/results/gpu/nvshmem/nccl-transport-w4). Collective over each
    pair (both ends of a send have the other as a net peer). `direct`: through the calls'
    own NCCL communicator (one NCCL group on the current stream) instead of torch's."""
    peers = sorted({x.peer for x in program.net if isinstance(x, (SendLaunch, RecvLaunch))})
    out = torch.zeros(len(peers), dtype=torch.float32, device=device)
    into = torch.empty(len(peers), dtype=torch.float32, device=device)
    if direct is not None:
        stream = torch.cuda.current_stream(device)
        with direct.group():
            for i, peer in enumerate(peers):
                direct.send(out[i:i + 1], peer, stream)
                direct.recv(into[i:i + 1], peer, stream)
    else:
        ops = [op for i, peer in enumerate(peers) for op in (
            dist.P2POp(dist.isend, out[i:i + 1], _global_rank(group, peer), group),
            dist.P2POp(dist.irecv, into[i:i + 1], _global_rank(group, peer), group))]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    torch.cuda.synchronize(device)


def _put(p: _Put) -> None:
    """Launch one put on the current stream (Triton's JIT dispatch: a few microseconds of host
    time per put in eager mode; a CUDA graph replays it for free)."""
    from hiercoll.kernels.nvshmem_put import LANES, NUM_WARPS, put_kernel
    put_kernel()[(p.grid,)](p.dst, p.src, p.nbytes, p.chunk, p.sigs, p.pes, len(p.pes), p.sig,
                            p.waits, p.n_wait, p.epoch, p.spin_limit, p.err, p.row,
                            LANES=LANES.value, num_warps=NUM_WARPS)


def _kernel(prepared: CudaPrepared, launch: KernelLaunch, stream: torch.cuda.Stream,
            bump_epoch: bool = False, fused: bool = False, timer: LaunchTimer | None = None,
            channel: int = -1, io: tuple[int, int] | None = None) -> None:
    """Launch on `stream`: bound (one call of Triton's launcher, `kernels.program.BoundLaunch`)
    where `build_prepared` bound it, else through the JIT, which launches on the current stream
    (callers without a bound launch run under `torch.cuda.stream(stream)`)."""
    bound = prepared.bound.get(id(launch))
    if bound is not None and timer is None:      # the eager hot path: one launcher call
        bound(stream.cuda_stream, io)
        return

    def go() -> None:
        if bound is not None:
            bound(stream.cuda_stream, io)
        else:
            from hiercoll.kernels.program import launch_rows
            state = prepared.kernel if io is None else replace(
                prepared.kernel, in_delta=io[0], out_delta=io[1])
            with torch.cuda.stream(stream):
                launch_rows(state, prepared.table.launches[id(launch)],
                            reduce_op=prepared.reduce_op, spin_limit=prepared.spin_limit,
                            bump_epoch=bump_epoch, fused=fused)
    if timer is None:
        go()
    else:
        timer.around(launch_label(launch), channel, go)


def check_timeouts(prepared: CudaPrepared) -> None:
    """Raise naming rank, op and producer if a debug-mode wait gave up (synchronises)."""
    torch.cuda.synchronize()
    err = prepared.kernel.err.tolist()
    if err[0]:
        t = prepared.table
        row, widx = int(err[1]), int(err[2])
        if row < 0:        # an NVSHMEM put's own wait (_put_args numbers them -1, -2, ...)
            raise VerificationError(put_timeout_line(prepared.program, err,
                                                     int(prepared.kernel.epoch[0].item())))
        if widx < 0:       # an LL row: a word still short of the call's epoch
            raise VerificationError(
                f"rank {prepared.rank}: op {t.row_names[row]} timed out waiting for a peer's "
                f"LL push (a word carried epoch {err[3]}, needed {err[4]})")
        producer = _producer_of(t, prepared, row, widx)
        raise VerificationError(
            f"rank {prepared.rank}: op {t.row_names[row]} timed out waiting for "
            f"{producer} (slot value {err[3]}, needed {err[4]}; epoch "
            f"{int(prepared.kernel.epoch[0].item())})")


def put_timeout_line(program: RankProgram, err: list[int], epoch: int) -> str:
    """What a put kernel's debug timeout says: the put (its row in the error record is -1 - its
    `put_launches` index), the producer of the wait that gave up, the slot's value and need."""
    put = put_launches(program)[-1 - err[1]]
    return (f"rank {program.rank}: the put of op {put.op} timed out waiting for "
            f"{put.waits[err[2]].producer} (slot value {err[3]}, needed {err[4]}; epoch {epoch})")


def _producer_of(table: Table, prepared: CudaPrepared, row: int, widx: int) -> str:
    """The producer named by wait `widx` of row `row` (rows list their waits in order)."""
    before = sum(table.words[i * ROW_WORDS + F_NWAIT] for i in range(row))
    return table.wait_producers[before + widx]


def _grid(program: RankProgram) -> int:
    grids = [x.grid for items in program.streams.values() for x in items
             if isinstance(x, KernelLaunch) and any(r.count for r in x.rows)]
    return max(grids, default=1)
