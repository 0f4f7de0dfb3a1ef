"""What the cuda backend launches, in which order, with which signals. Pure Python (no torch), so
CI tests it on CPU; the runtime (`backend.py`) only turns these objects into tensors and launches.

Model. Every rank holds one symmetric data allocation (all its buffers at the same element offsets
on every rank, `SymmetricLayout`) and one symmetric int32 signal array with one slot per op of the
whole schedule (its global id) plus barrier slots. Op P finishing adds 1 per CTA to slot gid(P) on
every rank that waits for it (release, system scope); a waiter needs `per_epoch * epoch` (acquire,
system scope), where `epoch` counts calls (a device counter, so CUDA-graph replay works and slots
are never reset). Each channel of a rank is one stream; consecutive SM ops of a channel form one
persistent kernel launch that walks their rows, with a grid-wide wait on the previous row (channel
order) where the launch has several CTAs (one CTA walks its rows in order, a CTA barrier between
rows); copy-engine ops become [wait row] copy [signal row]. A small row whose successor waits for
nothing hands its signals to it (one release fence for both). Each call is fenced by two barriers:
a start barrier after the copy-in (no peer reads this rank's input, or writes its scratch and
output, before this rank has its new input in and has copied out the previous call's output) and
an end barrier before the copy-out (every peer's pushes into this rank's output are done). The
emulator (emulate.py) found the need for the start barrier: without it a fast rank's next call
overwrote a slow rank's output before the copy-out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from hiercoll.errors import HiercollError
from hiercoll.executor.order import Levels, levels
from hiercoll.kernels.abi import LL_STEP_WORDS, STEP_ELEMENTS, WAIT_WIDE_SHIFT
from hiercoll.ll_protocol import (
    DEFAULT_LL_THRESHOLD_BYTES,
    DEFAULT_LL_UNPACK_PEERS,
    LLPlan,
    elements_per_word,
    ll_limit_bytes,
    ll_plan,
    ll_plan_or_reason,
    ll_unpack_peer_limit,
)
from hiercoll.schedule import INPUT, OUTPUT, Op, OpKind, OpRef, Region, Schedule, Transport
from hiercoll.sim.engine import on_copy_engine
from hiercoll.sim.row_merge import MERGE_MAX_BYTES

SPINS_PER_MS = 1000      # rough: one acquire poll of a local slot takes about a microsecond


def spin_limit_for(timeout_ms: float) -> int:
    """Polls a signal wait may spin before it gives up and reports (0: it never gives up)."""
    return math.ceil(timeout_ms * SPINS_PER_MS)


ALIGN_BYTES = 256           # every buffer starts on this boundary inside the allocation
VECTOR_BYTES = 16           # one vector access; regions aligned to it take the vectorised kernel
# Auto grid: one CTA per step of the largest SM op (every CTA does one step of it at once), up
# to `CudaOptions.max_ctas`. A CTA's step is one round trip of its loads; over NVLink that is
# microseconds, so a 256 KiB pull on 4 CTAs (8 steps each) took 26 us where 32 CTAs take one
# round trip, and big ops need every SM's loads in flight to stream at link rate. The cap is the
# GPU's SM count (132 on an H100 SXM or H200): a call ends with its slowest CTA, so a 128-step op
# on 120 CTAs (8 of them doing two steps) took 13.2 us at 1 MiB where 132 CTAs take 12.0 (2 x
# H200, results/gpu/mid-w2/grid-sweep). The row kernel takes one CTA an SM (its registers:
# results/kernel_registers.md), so more CTAs than SMs are not all resident at once, and CTAs
# that spin on each other then never finish (264 CTAs hung there).
DEFAULT_MAX_CTAS = 132
COPY_ENGINE_OFF = 1 << 40    # the default copy-engine threshold: no copy reaches it


class Engine(StrEnum):
    SM = "sm"       # Triton kernel: loads/stores through peer mappings
    CE = "ce"       # copy engine: peer_view.copy_()
    NET = "net"     # inter-node transport: NCCL send/recv, or an NVSHMEM put-with-signal


class Protocol(StrEnum):
    """How a plan's edges carry data and order (ll_protocol.py says why there are two; its
    PROTOCOLS lists these values for the simulator's side)."""

    AUTO = "auto"       # LL where the plan qualifies (ll_protocol) and is small (ll_threshold_bytes)
    SIMPLE = "simple"   # data, then a release signal; consumers acquire; barriers around a call
    LL = "ll"           # flags in the data words, no signal, no barrier (plans ll_protocol admits)


class InterTransport(StrEnum):
    """How ops that cross nodes (transport `inter`) move data."""

    PEER = "peer"   # like intra-node ops, through peer mappings (all GPUs in one NVLink domain)
    NCCL = "nccl"   # send/recv on a per-rank net stream, in one global order (no peer mapping)
    NVSHMEM = "nvshmem"   # the sender's put-with-signal (no receiver work): on its net stream,
    #                       or inline on the single stream (graph mode: `_put_senders_order`)


# An NVSHMEM put runs on this many CTAs per this many bytes, up to NVSHMEM_MAX_CTAS: measured on
# 2 x H200 (results/gpu/nvshmem-probe), one CTA's block put moves 5-11 GB/s, 32 CTAs 272 GB/s at
# 16 MiB and 64 CTAs 278 GB/s at 64 MiB (the copy engine: 350-380): a CTA's put is bound by its
# own store loop (~10 GB/s, linear in CTAs up to 32), so a CTA takes 32 KiB (~3 us at that
# rate), not more: at 128 KiB a CTA (stop 38's 4 x H200 run) a 1 MiB put had 8 CTAs, ~13 us of
# stores at that rate (derived from the probe, not timed on its own)
NVSHMEM_BYTES_PER_CTA = 32 * 1024
NVSHMEM_MAX_CTAS = 64


def sync_slots(num_ops: int, world: int) -> int:
    """The signal slots every simple program has: one per op of the schedule, then the start
    and end barriers' (one per rank each), plus one."""
    return num_ops + 2 * world + 1


def put_chunk_bytes(nbytes: int, ctas: int) -> int:
    """Bytes each CTA of a put moves: the put split evenly, rounded up to 16 (vector-aligned
    chunks); the last CTA's chunk may be shorter, even empty (it still signals)."""
    chunk = -(-nbytes // max(ctas, 1))
    return max(16, -(-chunk // 16) * 16)


def warm_slot(program: RankProgram) -> int:
    """The 64-bit slot (no consumer waits on it) a program with NVSHMEM puts signals when its put
    kernel is built and run once at prepare time: the first put of a call must not sit in the JIT
    while its consumers' waits run out (the first 2-GPU run's debug timeouts)."""
    return program.num_slots - 2


def nvshmem_put_ctas(nbytes: int) -> int:
    """CTAs of one put: each moves a contiguous chunk and signals once (ADD 1)."""
    return max(1, min(NVSHMEM_MAX_CTAS, -(-nbytes // NVSHMEM_BYTES_PER_CTA)))


def _knob(default: object, flag: str, help: str, size: bool = False) -> Any:
    """A CudaOptions field with its command-line flag: the CLI builds its flags from these."""
    return field(default=default, metadata={"flag": flag, "help": help, "size": size})


@dataclass(frozen=True)
class CudaOptions:
    """The lowering's knobs (the auto-picker may tune them): declared here, once, with the
    command-line flag of each (`hiercoll.cli.backend_args` builds the flags from them)."""

    # default: no copy engine. With copy-engine-sized operands of reduces forwarded (pulled)
    # and a level's rows side by side on the grid, SM copies beat the copy engine on 2 x H200
    # at 16 MiB..1 GiB (all_gather 1.19-1.60x, all_to_all 1.16-1.56x faster: results/gpu/
    # large-w2); the copy engine frees SMs for overlapped compute, so it stays one flag away
    ce_threshold_bytes: int = _knob(
        COPY_ENGINE_OFF, "--ce-threshold", "cuda: copies of at least this many bytes use the "
        "copy engine (default 1024GiB: none; the SMs' copies run side by side in one kernel)",
        size=True)
    ctas: int | None = _knob(None, "--ctas", "cuda: CTAs per kernel (default auto)")
    max_ctas: int = _knob(
        DEFAULT_MAX_CTAS, "--max-ctas", "cuda: most CTAs of an auto grid (default: the group's "
        "smallest SM count, at most 132; every CTA of a launch must be resident at once)")
    debug_timeout_ms: float = _knob(
        0.0, "--debug-timeout-ms", "cuda: abort a signal wait after this long and report "
        "rank/op/peer")
    inter_transport: InterTransport = _knob(
        InterTransport.PEER, "--inter-transport", "cuda: inter-node copies through peer mappings "
        "(one NVLink domain), NCCL send/recv between the owners, or NVSHMEM put-with-signal "
        "from the sender (torch's NVSHMEM symmetric-memory backend)")
    single_stream: bool = _knob(
        False, "--single-stream", "cuda: one stream per rank in a global dependency order (no "
        "kernel can wait on a sibling branch of its own CUDA graph)")
    fuse: bool = _knob(
        True, "--no-fuse", "cuda: keep barriers as their own launches (single-stream programs "
        "without copy-engine ops are otherwise one kernel per call)")
    launch_per_op: bool = _knob(
        False, "--launch-per-op", "cuda: one kernel launch per op (what --profile times per op; "
        "slower: consecutive ops of a channel otherwise share one launch)")
    protocol: Protocol = _knob(
        Protocol.AUTO, "--protocol", "cuda: auto: LL (flags in the data, no barriers) for "
        "plans that push each region once, up to --ll-threshold, else simple; simple or ll "
        "force one (ll where the plan qualifies: ll_protocol.py)")
    ll_threshold_bytes: int = _knob(
        DEFAULT_LL_THRESHOLD_BYTES, "--ll-threshold", "cuda: --protocol auto takes LL when no op of the plan "
        "moves more than this", size=True)
    ll_unpack_peers: int = _knob(
        DEFAULT_LL_UNPACK_PEERS, "--ll-unpack-peers", "cuda: ... and, for a plan whose receivers "
        "unpack pushes into their output (all-gather, all-to-all, multi-hop all-reduce), when no "
        "rank unpacks from more peers than this (default 1; ll_protocol.py has the measurements)")
    forward: bool = _knob(
        True, "--no-forward", "cuda: keep every copy as planned (by default a reader of a "
        "copy's scratch reads its source over the peer mapping instead: executor/cuda/"
        "forwarding.py)")
    split_channels: bool = _knob(
        True, "--no-split-channels", "cuda: keep the plan's order between independent ops of "
        "one channel (by default the ops at a channel's head that depend on nothing and touch "
        "disjoint memory run side by side: sim/channel_split.py)")

    def tuned(self, executor: dict[str, Any]) -> CudaOptions:
        """These options with a tuning file's `executor` knobs (the auto-picker's choice for the
        plan's size, `planner.search.autopick`) applied."""
        unknown = sorted(set(executor) - set(TUNED_KNOBS))
        if unknown:
            raise HiercollError(f"tuning executor: {unknown[0]!r} is not a knob the cuda backend "
                                f"takes from a tuning file ({', '.join(TUNED_KNOBS)})")
        try:
            return replace(self, **executor)
        except TypeError as exc:
            raise HiercollError(f"tuning executor: {exc}") from None

    def __post_init__(self) -> None:
        if not isinstance(self.ce_threshold_bytes, int) or isinstance(self.ce_threshold_bytes,
                                                                       bool):
            raise HiercollError(f"ce_threshold_bytes: {self.ce_threshold_bytes!r} must be an "
                                "integer number of bytes")
        if self.ce_threshold_bytes < 0:
            raise HiercollError(f"ce_threshold_bytes: {self.ce_threshold_bytes} must be >= 0")
        if self.ctas is not None and not 1 <= self.ctas <= DEFAULT_MAX_CTAS:
            raise HiercollError(f"ctas: {self.ctas} must be in 1..{DEFAULT_MAX_CTAS} (one H200 "
                                f"has {DEFAULT_MAX_CTAS} SMs)")
        if not isinstance(self.max_ctas, int) or not 1 <= self.max_ctas <= DEFAULT_MAX_CTAS:
            raise HiercollError(f"max_ctas: {self.max_ctas!r} must be in 1..{DEFAULT_MAX_CTAS} "
                                f"(one H200 has {DEFAULT_MAX_CTAS} SMs)")
        if self.debug_timeout_ms < 0:
            raise HiercollError(f"debug_timeout_ms: {self.debug_timeout_ms} must be >= 0")
        try:
            object.__setattr__(self, "inter_transport", InterTransport(self.inter_transport))
        except ValueError:
            raise HiercollError(f"inter_transport: {self.inter_transport!r} should be one of "
                                f"{', '.join(t.value for t in InterTransport)}") from None
        try:
            object.__setattr__(self, "protocol", Protocol(self.protocol))
        except ValueError:
            raise HiercollError(f"protocol: {self.protocol!r} should be one of "
                                f"{', '.join(t.value for t in Protocol)}") from None
        for name in ("ll_threshold_bytes", "ll_unpack_peers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise HiercollError(f"{name}: {value!r} must be an integer >= 0")


TUNED_KNOBS = ("ce_threshold_bytes",)   # what the auto-picker chooses (tuning.json "executor")


@dataclass(frozen=True)
class SymmetricLayout:
    """Element offset of every buffer in the per-rank allocation (identical on all ranks)."""

    offsets: dict[str, int]
    sizes: dict[str, int]       # the largest size of the buffer over ranks
    total: int                  # elements of the allocation

    def addr(self, region: Region) -> Addr:
        return Addr(region.rank, self.offsets[region.buffer] + region.offset)


@dataclass(frozen=True, order=True)
class Addr:
    """Element `offset` of rank `rank`'s symmetric data allocation."""

    rank: int
    offset: int


@dataclass(frozen=True)
class Wait:
    """Spin until this rank's slot `slot` >= per_epoch * epoch; `producer` names who signals.
    `wide`: the slot is the low word of an NVSHMEM put's 64-bit signal (the kernel reads the
    whole word: a 32-bit read of half a 64-bit atomic is outside the PTX model's ordering)."""

    slot: int
    per_epoch: int
    producer: str        # "r.i" op id, or "barrier:<name>@rank"
    wide: bool = False

    @property
    def word(self) -> int:
        """The table's second word of this wait (kernels/abi.py `WAIT_WORDS`): per_epoch, and
        the wide flag above it."""
        return self.per_epoch | int(self.wide) << WAIT_WIDE_SHIFT


@dataclass(frozen=True)
class Signal:
    """Add 1 per CTA to slot `slot` of rank `rank` (release, system scope)."""

    rank: int
    slot: int


@dataclass(frozen=True)
class Row:
    """One step of a kernel launch: wait, move/reduce `count` elements, signal."""

    op: str                       # "r.i", or a pseudo-op name for barriers / CE fences
    count: int
    dst: Addr | None
    srcs: tuple[Addr, ...]
    reduce: bool
    accumulate: bool
    scale: float
    waits: tuple[Wait, ...]
    signals: tuple[Signal, ...]
    # the signals order nothing this kernel stored (see `_fused`): plain relaxed adds, without
    # the system-scope release fence (about 0.65 us a row on an H200, kernel_trace.py)
    relaxed: bool = False
    # LL rows (ll.py): bit 0, `dst` is in the LL area (a push of flagged words); bit 1 + s,
    # source s is (its words are read until they carry the call's epoch). LL addresses are
    # element offsets into the rank's LL area (one parity), not its data allocation.
    ll: int = 0
    # the CTAs [lo, hi) of the launch that run the row (None: all of them): rows of one
    # dependency level split the grid and run side by side (`_cta_ranges`)
    ctas: tuple[int, int] | None = None
    # more destinations of the row's result, stored as each step computes it: copies of the
    # result merged into the row (`_merge_result_copies`)
    also: tuple[Addr, ...] = ()


@dataclass(frozen=True)
class KernelLaunch:
    rows: tuple[Row, ...]
    grid: int
    aligned: bool                 # every row's regions are VECTOR_BYTES-aligned


@dataclass(frozen=True)
class CopyLaunch:
    op: str
    dst: Addr
    src: Addr
    count: int


@dataclass(frozen=True)
class SendLaunch:
    """Send `count` elements at `src` (this rank's allocation) to rank `peer` (NET engine)."""

    op: str
    src: Addr
    count: int
    peer: int


@dataclass(frozen=True)
class RecvLaunch:
    """Receive `count` elements from rank `peer` into `dst` (this rank's allocation)."""

    op: str
    dst: Addr
    count: int
    peer: int


@dataclass(frozen=True)
class PutLaunch:
    """NVSHMEM (`--inter-transport nvshmem`): `count` elements at `src` (this rank) into `dst` of
    rank `peer`'s symmetric allocation, on `ctas` CTAs; each CTA first waits for `waits` (what the
    put reads was produced, and what it overwrites was read: every thread polls, then acquires,
    as a row does), then puts its chunk and adds 1 to
    `peer`'s slot `signals[0]` once its chunk has landed (put-with-signal: NVSHMEM delivers the
    data before the signal), then, after a quiet (every chunk of this CTA complete), adds 1 to
    the slot of every other rank in `signals` (consumers that read the data through `peer`'s
    mapping, or this rank's channel successor). Slots are 64-bit NVSHMEM signals: two int32
    slots, the count in the first (little-endian), the second always 0."""

    op: str
    src: Addr
    dst: Addr
    count: int
    peer: int
    signals: tuple[Signal, ...]
    ctas: int
    waits: tuple[Wait, ...] = ()


Launch = KernelLaunch | CopyLaunch | SendLaunch | RecvLaunch | PutLaunch


@dataclass(frozen=True)
class RankProgram:
    """Everything rank `rank` launches for one call, in order."""

    rank: int
    layout: SymmetricLayout
    num_slots: int
    start_barrier: KernelLaunch | None
    streams: dict[int, tuple[Launch, ...]]    # channel -> launches, in stream order
    end_barrier: KernelLaunch
    copy_in_output: bool                      # group_reduce accumulates into the output
    notes: tuple[str, ...] = field(default=())
    net: tuple[Launch, ...] = ()              # the net stream (NET engine), in global order
    fused: bool = False   # one launch per call: both barriers are rows of streams[0]'s only
    #                       launch, which also starts the epoch (no start/end barrier launches)
    ll_elements: int = 0  # LL program (ll.py): its one launch walks LL rows; the LL area holds
    #                       this many elements per parity, at the start of the signal allocation
    ll_epw: int = 0       # elements per LL word (2 for 16-bit types, 1 for 32-bit)
    ll_in_place: bool = False   # LL: may run with the output where the input is (ll.py)

    @property
    def ll_half(self) -> int:
        """int32 slots of one parity of the LL area (a word is two slots: data, epoch)."""
        return 2 * self.ll_elements // self.ll_epw if self.ll_epw else 0


class CallStep(StrEnum):
    """One step of a call on a rank's main stream (see the module docstring for why each is
    there). The one definition of the call protocol: the runtime enqueues these steps and the
    emulator steps through the same list."""

    COPY_IN = "copy_in"              # user input (and an accumulating output) into symmetric memory
    EPOCH = "epoch"                  # the call's epoch starts (host-side add: no start barrier)
    START_BARRIER = "start_barrier"  # its one CTA starts the epoch, then meets every peer
    FUSED = "fused"                  # the call's only kernel: epoch, both barriers and every row
    FORK = "fork"                    # channel streams (and the net stream) start after the main one
    JOIN = "join"                    # the main stream waits for every channel stream
    END_BARRIER = "end_barrier"      # every peer's pushes into this rank are done
    COPY_OUT = "copy_out"            # the symmetric output into the user's tensor


def call_steps(program: RankProgram) -> tuple[CallStep, ...]:
    """The main stream's steps of one call of `program`, in order."""
    if program.fused:
        return (CallStep.COPY_IN, CallStep.FUSED, CallStep.COPY_OUT)
    start = CallStep.START_BARRIER if program.start_barrier is not None else CallStep.EPOCH
    return (CallStep.COPY_IN, start, CallStep.FORK, CallStep.JOIN, CallStep.END_BARRIER,
            CallStep.COPY_OUT)


def put_launches(program: RankProgram) -> list[PutLaunch]:
    """A program's NVSHMEM puts in one fixed order (its streams by channel, then the net
    stream): how the backend numbers them."""
    return [x for items in (*program.streams.values(), program.net) for x in items
            if isinstance(x, PutLaunch)]


def launch_label(launch: KernelLaunch | CopyLaunch) -> str:
    """What a launch does, for timelines: its ops' ids (rows that move data), else the name of
    its first row (a barrier or a copy-engine fence)."""
    if isinstance(launch, CopyLaunch):
        return launch.op
    ops = [r.op for r in launch.rows if r.count]
    return ",".join(ops) if ops else (launch.rows[0].op if launch.rows else "empty")


def fused_launch(program: RankProgram) -> KernelLaunch:
    """A fused program's one kernel (streams[0]'s only launch)."""
    (launch,) = program.streams[0]
    assert isinstance(launch, KernelLaunch)
    return launch


@dataclass(frozen=True)
class _Global:
    """Schedule-wide facts every rank derives identically."""

    base: tuple[int, ...]          # global id of each rank's op 0
    num_ops: int
    grid: int
    engines: dict[OpRef, Engine]
    consumers: dict[OpRef, frozenset[int]]   # ranks that wait on an op's slot
    channel_prev: dict[OpRef, OpRef]         # the previous op on the same (rank, plan channel)
    issue: tuple[tuple[tuple[int, Op], ...], ...]   # per rank: (stream key, op) in issue order
    ranges: dict[OpRef, tuple[int, int]] = field(default_factory=dict)  # SM ops on part of the grid
    sm_prev: dict[OpRef, OpRef] = field(default_factory=dict)   # SM op before on its channel
    # (consumer, producer) pairs ordered by the CTAs themselves (`_cta_local`): no signal, no wait
    local: frozenset[tuple[OpRef, OpRef]] = frozenset()
    # NVSHMEM puts: their 64-bit signal slots (even int32 indices after the barrier slots) and CTAs
    net_slots: dict[OpRef, int] = field(default_factory=dict)
    put_ctas: dict[OpRef, int] = field(default_factory=dict)
    # per rank, what its streams launch in order: `issue`, except that single-stream NVSHMEM
    # programs launch each put on the sender's one stream at its level (`inline_puts`)
    launch_order: tuple[tuple[tuple[int, Op], ...], ...] = ()
    inline_puts: bool = False

    def gid(self, ref: OpRef) -> int:
        return self.base[ref[0]] + ref[1]

    def slot(self, ref: OpRef) -> int:
        """The signal slot consumers of `ref` wait on: its global id, or an NVSHMEM put's own."""
        return self.net_slots.get(ref, self.gid(ref))

    def num_slots(self, world: int) -> int:
        """int32 slots of the signal allocation: `sync_slots`, then two per NVSHMEM put and,
        with puts, a last pair the put kernel's warm-up signals (`warm_slot`)."""
        if not self.net_slots:
            return sync_slots(self.num_ops, world)
        return max(self.net_slots.values()) + 4

    def per_epoch(self, ref: OpRef) -> int:
        """Signals an op sends per call: one per CTA that runs it."""
        if ref in self.put_ctas:
            return self.put_ctas[ref]
        if self.engines[ref] != Engine.SM:
            return 1
        lo, hi = self.ranges.get(ref, (0, self.grid))
        return hi - lo

    def wait_on(self, ref: OpRef) -> Wait:
        """A consumer's wait for every signal `ref` sends in a call."""
        return Wait(self.slot(ref), self.per_epoch(ref), f"{ref[0]}.{ref[1]}",
                    wide=ref in self.net_slots)

    def explicit_prev(self, ref: OpRef) -> OpRef | None:
        """The channel predecessor this op must wait on by signal: stream order cannot give it
        when either op runs on the net stream."""
        p = self.channel_prev.get(ref)
        if p is not None and Engine.NET in (self.engines[p], self.engines[ref]):
            return p
        return None


def symmetric_layout(schedule: Schedule) -> SymmetricLayout:
    schedule.check_walk("running it")
    sizes: dict[str, int] = {}
    for r in range(schedule.world_size):
        for name, n in schedule.buffers(r).items():
            sizes[name] = max(sizes.get(name, 0), n)
    align = max(1, ALIGN_BYTES // schedule.spec.dtype.itemsize)
    offsets, pos = {}, 0
    for name in [INPUT, OUTPUT] + sorted(set(sizes) - {INPUT, OUTPUT}):
        offsets[name] = pos
        pos += -(-max(sizes.get(name, 0), 1) // align) * align
    return SymmetricLayout(offsets, sizes, pos)


def _engine(op: Op, itemsize: int, opts: CudaOptions) -> Engine:
    if (opts.inter_transport != InterTransport.PEER and op.transport == Transport.INTER
            and op.kind == OpKind.COPY):
        return Engine.NET
    # the simulator's rule, so what it times on a copy engine runs on one
    return Engine.CE if on_copy_engine(op, itemsize, opts.ce_threshold_bytes) else Engine.SM


def _steps(op: Op) -> int:
    """How many CTA steps an op's data is (at least one)."""
    return max(1, -(-op.dst.count // STEP_ELEMENTS))


def _level_groups(layered: Levels, engines: dict[OpRef, Engine]) -> list[list[Op]]:
    """Per dependency level and rank, its SM ops: independent of each other (no dependency,
    different channels), and adjacent in the single-stream issue order."""
    groups: list[list[Op]] = []
    for level in layered.levels:
        by_rank: dict[int, list[Op]] = {}
        for op in level:
            if engines[op.ref] == Engine.SM:
                by_rank.setdefault(op.rank, []).append(op)
        groups.extend(by_rank.values())
    return groups


def _cta_ranges(groups: list[list[Op]], grid: int) -> dict[OpRef, tuple[int, int]]:
    """The single-stream kernel's grid split among the ops of each level, in proportion to
    their steps (at least one CTA each): they run side by side instead of one after another,
    so a rank's pushes to different peers, or a local copy and a push, use their links at once
    (with every CTA on every row, independent ops ran in turn). Levels with more ops than CTAs
    keep every op on the whole grid."""
    out: dict[OpRef, tuple[int, int]] = {}
    for group in groups:
        if not 1 < len(group) <= grid:
            continue
        steps = [_steps(op) for op in group]
        total = sum(steps)
        shares = [max(1, s * grid // total) for s in steps]
        while sum(shares) > grid:
            shares[shares.index(max(shares))] -= 1
        while sum(shares) < grid:     # the rest to the op with the most steps per CTA
            k = max(range(len(group)), key=lambda i: (steps[i] / shares[i], -i))
            shares[k] += 1
        lo = 0
        for op, n in zip(group, shares):
            out[op.ref] = (lo, lo + n)
            lo += n
    return out


def _auto_grid(schedule: Schedule, engines: dict[OpRef, Engine], opts: CudaOptions,
               groups: list[list[Op]]) -> int:
    if opts.ctas is not None:
        return opts.ctas
    most = _grid_cap(engines, opts)
    if opts.single_stream:     # one kernel: a level's ops share its grid (`_cta_ranges`)
        need = max((sum(_steps(op) for op in g) for g in groups), default=1)
        return max(1, min(most, need))
    itemsize = schedule.spec.dtype.itemsize
    biggest = max((op.dst.count * itemsize for op in schedule.ops()
                   if engines[op.ref] == Engine.SM), default=0)
    channels = max((len({op.channel for op in schedule.rank_ops(r)})
                    for r in range(schedule.world_size)), default=1)
    cap = max(1, most // max(channels, 1))
    return max(1, min(cap, -(-biggest // (STEP_ELEMENTS * itemsize))))


# SMs an auto grid leaves free where other work must run beside the row kernels: the one-CTA
# wait/signal launches around a copy-engine copy, NCCL's send/recv kernels, NVSHMEM puts on a
# net stream. The row kernel takes one CTA an SM (181-255 registers a thread x 256 threads,
# sm_90: bench/results/kernel_registers.md): a grid of every SM whose CTAs spin on a signal that
# such work sets would never see it.
SIDE_WORK_SMS = 12


def _grid_cap(engines: dict[OpRef, Engine], opts: CudaOptions) -> int:
    """The most CTAs of an auto grid: every SM (`max_ctas`) where every op is a row of the row
    kernel (the kernels of a call then fit the GPU together: their grids sum to at most
    `max_ctas`); SIDE_WORK_SMS fewer where copy-engine or net ops run beside them; at most half
    the SMs beside NCCL's send/recv. NCCL's P2P kernel runs one CTA per channel (up to 64), and a
    channel's CTA on one rank waits for the same channel's CTA on its peer: with fewer SMs free
    than it has channels, two ranks can run different channels and wait for each other forever
    (4 x H200, 2 nodes x 2, `hier` reduce-scatter: hung at 4 and 16 MiB with 12 SMs free; ran
    with 68 free, or with NCCL_MAX_NCHANNELS=4)."""
    if all(e == Engine.SM for e in engines.values()):
        return opts.max_ctas
    cap = opts.max_ctas - SIDE_WORK_SMS
    if opts.inter_transport == InterTransport.NCCL and Engine.NET in engines.values():
        cap = min(cap, opts.max_ctas // 2)
    return max(1, cap)


def _global(schedule: Schedule, opts: CudaOptions) -> _Global:
    w, itemsize = schedule.world_size, schedule.spec.dtype.itemsize
    base, n = [], 0
    for r in range(w):
        base.append(n)
        n += len(schedule.rank_ops(r))
    engines = {op.ref: _engine(op, itemsize, opts) for op in schedule.ops()}
    layered = levels(schedule) if opts.single_stream else None
    groups = _level_groups(layered, engines) if layered is not None else []
    grid = _auto_grid(schedule, engines, opts, groups)
    ranges = _cta_ranges(groups, grid)
    # (consumer, producer) pairs the CTAs order by themselves (`_cta_local`): rows of one launch,
    # so only in single-stream programs without copy-engine or net ops
    one_launch = (opts.single_stream and not opts.launch_per_op
                  and all(e == Engine.SM for e in engines.values()))
    local: set[tuple[OpRef, OpRef]] = set()
    consumers: dict[OpRef, set[int]] = {}
    channel_prev: dict[OpRef, OpRef] = {}
    issue = _issue_orders(schedule, layered)
    sm_prev: dict[OpRef, OpRef] = {}
    for r in range(w):
        on_channel: dict[tuple[int, int], Op] = {}
        for key, op in issue[r]:
            waiter = _waiter(op, engines)
            for d in op.deps:
                if one_launch and d[0] == r and _cta_local(schedule.op(d), op, ranges):
                    local.add((op.ref, d))
                else:
                    consumers.setdefault(d, set()).add(waiter)
            c = on_channel.get((key, op.channel))
            # a net op and its plan-channel neighbours run on different streams (or, inline,
            # different launches whose rows other CTAs may still be running): ordered by a
            # signal. The neighbour on the *plan* channel, not the one before in the stream:
            # one stream holds every channel's ops in level order, and the op just before may
            # be another channel's, running on other CTAs, which orders nothing
            if c is not None:
                channel_prev[op.ref] = c.ref
                if Engine.NET in (engines[c.ref], engines[op.ref]):
                    consumers.setdefault(c.ref, set()).add(waiter)
            # one CTA walks a launch's rows in order, a CTA barrier between rows: the plan's
            # channel order needs a signal only where several CTAs share the rows, and only
            # from the op before on the same plan channel (other channels' rows on this stream
            # are independent of it), unless the CTAs order the two rows themselves
            if c is not None and one_launch and _cta_local(c, op, ranges):
                local.add((op.ref, c.ref))
            elif c is not None and grid > 1 and engines[c.ref] == engines[op.ref] == Engine.SM:
                sm_prev[op.ref] = c.ref
                consumers.setdefault(c.ref, set()).add(waiter)
            on_channel[(key, op.channel)] = op
    net_slots: dict[OpRef, int] = {}
    put_ctas: dict[OpRef, int] = {}
    if opts.inter_transport == InterTransport.NVSHMEM:
        first = sync_slots(n, w)
        first += first % 2          # 8-byte aligned: NVSHMEM signals are 64-bit
        for op in schedule.ops():
            if engines[op.ref] == Engine.NET:
                net_slots[op.ref] = first + 2 * len(net_slots)
                put_ctas[op.ref] = nvshmem_put_ctas(op.dst.count * itemsize)
    # single stream with puts: each put inline on its sender's stream (`_put_senders_order`)
    launch_order = issue if layered is None or not net_slots else \
        _put_senders_order(layered, engines, w)
    return _Global(tuple(base), n, grid, engines,
                   {k: frozenset(v) for k, v in consumers.items()}, channel_prev, issue,
                   ranges, sm_prev, frozenset(local), net_slots, put_ctas, launch_order,
                   launch_order is not issue)


def _cta_local(p: Op, c: Op, ranges: dict[OpRef, tuple[int, int]]) -> bool:
    """Can each CTA order `c` after `p` (a rank's rows of one launch) by itself? When the two
    rows have the same CTAs and the same count, CTA c handles element i of both; if every region
    of one that conflicts with a region of the other (one of them writes it) is the same region,
    element for element, the CTA barrier between a CTA's rows orders each element's accesses,
    and the grid-wide signal and wait (a release fence and a round trip, about 2 us on an H200)
    go. E.g. two_shot's reduce of its shard and the push of that shard to the peers."""
    if p.dst.count != c.dst.count or ranges.get(p.ref) != ranges.get(c.ref):
        return False
    for a, a_writes in ((p.dst, True), *((x, False) for x in p.srcs)):
        for b, b_writes in ((c.dst, True), *((x, False) for x in c.srcs)):
            if (a_writes or b_writes) and a.overlaps(b) and a != b:
                return False
    return True


def _issue_orders(schedule: Schedule,
                  layered: Levels | None) -> tuple[tuple[tuple[int, Op], ...], ...]:
    """Per rank, the (stream key, op) pairs in the order they are enqueued: one stream per
    channel in program order, or (single_stream: `layered`, the schedule's levels) one stream in
    a global topological order, which cannot deadlock while all ranks run, whatever the GPU does
    with independent branches."""
    w = schedule.world_size
    if layered is None:
        return tuple(tuple((op.channel, op) for op in schedule.rank_ops(r)) for r in range(w))
    per_rank: list[list[tuple[int, Op]]] = [[] for _ in range(w)]
    for level in layered.levels:
        for op in level:
            per_rank[op.rank].append((0, op))
    return tuple(tuple(x) for x in per_rank)


def _put_senders_order(layered: Levels, engines: dict[OpRef, Engine],
                       world: int) -> tuple[tuple[tuple[int, Op], ...], ...]:
    """Single stream with NVSHMEM puts: each rank's ops in level order, a put in its sender's
    list. Why not a net stream: a CUDA graph makes the net stream a sibling branch of the main
    one, and CUDA may run sibling branches one after the other, so a put spinning on a row of
    the main branch (or a row spinning on the put) never returns (graph-mode replays on 2 x 2
    H200 failed this way, eager right). In level order on one stream nothing waits on a later
    launch of any rank's stream, so it cannot deadlock."""
    per_rank: list[list[tuple[int, Op]]] = [[] for _ in range(world)]
    for level in layered.levels:
        for op in level:
            per_rank[_waiter(op, engines)].append((0, op))
    return tuple(tuple(x) for x in per_rank)


def _waiter(op: Op, engines: dict[OpRef, Engine]) -> int:
    """The rank that waits before `op` starts: the sender for NET ops, else the issuer."""
    return op.srcs[0].rank if engines[op.ref] == Engine.NET else op.rank


def _aligned(rows: list[Row], itemsize: int) -> bool:
    vec = max(1, VECTOR_BYTES // itemsize)
    return all(r.count % vec == 0 and all(a.offset % vec == 0 for a in (r.dst, *r.srcs, *r.also)
                                          if a)
               for r in rows)


def lowered_schedule(schedule: Schedule, opts: CudaOptions) -> Schedule:
    """What the kernels run: the plan with its copies forwarded where allowed (forwarding.py)
    and a channel's independent head ops on channels of their own (channel_split.py). Every
    rank derives the same schedule (memoised: each rank's lowering asks for it). Not with
    `launch_per_op`: a per-op profile times the plan's ops as planned."""
    if opts.launch_per_op:
        return schedule
    from hiercoll.sim.forwarding import as_lowered
    # the copies `_engine` puts on SMs: not a copy engine, and between nodes only over peer
    # mappings (the NCCL transport's copies go to the net stream)
    return _per_schedule(_FORWARDED, opts, schedule, lambda: as_lowered(
        schedule, opts.ce_threshold_bytes, inter_peer=opts.inter_transport == InterTransport.PEER,
        forward=opts.forward, split=opts.split_channels and (opts.single_stream or opts.fuse)))


def _per_schedule(cache: dict[tuple[int, Any], tuple[Schedule, Any]], key: Any,
                  schedule: Schedule, make: Callable[[], Any]) -> Any:
    """`make()` for (this schedule, key), remembered: every rank's lowering asks the same
    schedule-wide question. Keyed by the schedule's id and held with it (an id is reused once
    its object is gone), at most a few entries (plans come and go)."""
    hit = cache.get((id(schedule), key))
    if hit is not None and hit[0] is schedule:
        return hit[1]
    out = make()
    if len(cache) > 16:
        cache.clear()
    cache[(id(schedule), key)] = (schedule, out)
    return out


_FORWARDED: dict[tuple[int, Any], tuple[Schedule, Any]] = {}
_GLOBALS: dict[tuple[int, Any], tuple[Schedule, Any]] = {}
_IN_PLACE: dict[tuple[int, Any], tuple[Schedule, Any]] = {}


def runs_in_place(schedule: Schedule, opts: CudaOptions) -> bool:
    """Whether the lowered program is right with every rank's output where its input is (one
    tensor, the caller's: `Communicator` then runs it with no copy at all). Asked of what the
    kernels run, not of the plan: forwarding turns a peer's copy of my input into a later pull
    of it, which in place may read what I already overwrote (`rd` is safe as planned and not
    as forwarded). LL programs answer from their own protocol (ll_protocol.py)."""
    def decide() -> bool:
        plan = ll_applies(schedule, opts)
        if plan is not None:
            return plan.in_place
        from hiercoll.sim.check import in_place_problems
        return not in_place_problems(lowered_schedule(schedule, opts))
    return bool(_per_schedule(_IN_PLACE, opts, schedule, decide))


def effective_options(schedule: Schedule, opts: CudaOptions) -> CudaOptions:
    """All-SM plans run as one kernel per call in eager mode too (single stream, fused): channel
    streams only pay off where copy-engine copies overlap kernels (a level's independent ops
    already run side by side on parts of one kernel's grid), and each extra launch and
    cross-stream wait costs the host microseconds per call (2 x H200, eager all_gather 1 MiB on
    channel streams: 77 us, NCCL 37)."""
    if opts.single_stream or not opts.fuse or opts.launch_per_op:
        return opts
    itemsize = schedule.spec.dtype.itemsize
    all_sm = all(_engine(op, itemsize, opts) == Engine.SM for op in schedule.ops())
    return replace(opts, single_stream=True) if all_sm else opts


def lower(schedule: Schedule, rank: int, opts: CudaOptions | None = None) -> RankProgram:
    """Rank `rank`'s program. Deterministic: every rank can lower every other rank."""
    opts = opts or CudaOptions()
    ll = _ll_lowering(schedule, rank, opts)
    if ll is not None:
        return ll
    schedule = lowered_schedule(schedule, opts)
    opts = effective_options(schedule, opts)
    # schedule-wide and the same for every rank: lowered once (a process that lowers every rank,
    # the emulator or the one-GPU cluster, paid it once per rank: 32-rank hier, 115 ms each)
    g: _Global = _per_schedule(_GLOBALS, opts, schedule, lambda: _global(schedule, opts))
    layout = symmetric_layout(schedule)
    itemsize = schedule.spec.dtype.itemsize
    w = schedule.world_size
    streams: dict[int, list[Launch]] = {}
    pending: dict[int, list[Row]] = {}
    in_launch: dict[int, set[OpRef]] = {}     # the ops of each stream's pending launch

    def flush(ch: int) -> None:
        rows = _coalesce_signals(_merge_result_copies(pending.pop(ch, []), itemsize, rank),
                                 itemsize)
        if rows:
            streams.setdefault(ch, []).append(KernelLaunch(tuple(rows), g.grid,
                                                           _aligned(rows, itemsize)))
        in_launch[ch] = set()

    launched: set[OpRef] = set()        # inline puts: this stream's ops before the put
    for key, op in g.launch_order[rank]:
        streams.setdefault(key, [])
        if g.engines[op.ref] == Engine.NET:     # runs on the net stream (below), or inline
            if g.inline_puts:
                flush(key)
                streams[key].extend(_put(g, layout, op, launched))
                launched.add(op.ref)
            continue
        launched.add(op.ref)
        waits = _waits(g, op)
        signals = _signals(g, op)
        if g.engines[op.ref] == Engine.CE:
            flush(key)
            streams[key].append(_wait_launch(op.id, waits))
            streams[key].append(CopyLaunch(op.id, layout.addr(op.dst),
                                                  layout.addr(op.srcs[0]), op.dst.count))
            streams[key].append(_signal_launch(op.id, signals))
            continue
        prev = g.sm_prev.get(op.ref)
        if prev is not None and prev in in_launch.get(key, ()) and prev not in op.deps:
            waits.append(g.wait_on(prev))
        pending.setdefault(key, []).append(Row(
            op.id, op.dst.count, layout.addr(op.dst), tuple(layout.addr(s) for s in op.srcs),
            op.kind == OpKind.REDUCE, op.accumulate, op.scale, tuple(waits), signals,
            ctas=g.ranges.get(op.ref)))
        in_launch.setdefault(key, set()).add(op.ref)
        if opts.launch_per_op:
            flush(key)          # stream order keeps the channel's order between launches
    for ch in list(pending):
        flush(ch)
    notes = []
    if opts.protocol == Protocol.LL:     # asked for and not taken: say why
        why = ll_plan_or_reason(schedule, 1 << 62,
                                peer_inter=opts.inter_transport == InterTransport.PEER)
        notes.append(f"--protocol ll not taken ({why}): the simple lowering runs it")
    if opts.inter_transport == InterTransport.PEER and any(
            op.transport == Transport.INTER for op in schedule.rank_ops(rank)):
        notes.append("inter-node ops run through peer mappings (all ranks share one NVLink "
                     "domain here); no RDMA transport is used")
    if opts.inter_transport != InterTransport.PEER and any(
            op.transport == Transport.INTER and op.kind == OpKind.REDUCE
            for op in schedule.rank_ops(rank)):
        notes.append("inter-node reduce ops (reduce here, store on the other node) still run "
                     f"through peer mappings; only copies use {opts.inter_transport.value}")
    net = _net_stream(schedule, g, layout, rank)
    puts = sum(isinstance(x, PutLaunch) for items in (*streams.values(), net) for x in items)
    if puts:
        where = "inline on its one stream" if g.inline_puts else "on its net stream"
        notes.append(f"{puts} inter-node copies from this rank run as NVSHMEM put-with-signal "
                     f"{where} (the receiver does no work; its consumers wait on the put's "
                     "signal)")
    streams = {ch: v for ch, v in streams.items() if v}
    if _fusable(g, opts):
        return _fused(g, w, rank, layout, streams, schedule.spec.accumulates_output, notes)
    return RankProgram(rank, layout, g.num_slots(w),
                       _barrier(g, w, rank, 0, "start") if w > 1 else None,
                       {ch: tuple(v) for ch, v in sorted(streams.items())},
                       _barrier(g, w, rank, 1, "end"), schedule.spec.accumulates_output,
                       tuple(notes), net)


def ll_applies(schedule: Schedule, opts: CudaOptions) -> LLPlan | None:
    """The LL plan `lower` runs `schedule` with under `opts`, or None (simple). Memoised like
    `lowered_schedule`: every rank asks."""
    limit = ll_limit_bytes(str(opts.protocol), opts.fuse, opts.launch_per_op,
                           opts.ll_threshold_bytes, opts.ce_threshold_bytes)
    if limit is None:
        return None
    peer = opts.inter_transport == InterTransport.PEER
    unpack = ll_unpack_peer_limit(str(opts.protocol), opts.ll_unpack_peers)
    plan: LLPlan | None = _per_schedule(_LL_PLANS, (limit, peer, unpack), schedule,
                                        lambda: ll_plan(schedule, limit, peer, unpack))
    return plan


_LL_PLANS: dict[tuple[int, Any], tuple[Schedule, Any]] = {}


def _ll_lowering(schedule: Schedule, rank: int, opts: CudaOptions) -> RankProgram | None:
    """Rank `rank`'s LL program (ll.py): one launch, no barriers, no signals. Its rows: its
    ops in the plan's order (by dependency level, pushes first: the bytes leave at once), then
    the unpacking of pushes it received into its output."""
    plan = ll_applies(schedule, opts)
    if plan is None:
        return None
    layout = symmetric_layout(schedule)
    itemsize = schedule.spec.dtype.itemsize

    def area(region: Region) -> Addr:
        return Addr(region.rank, plan.area[region.buffer] + region.offset)

    rows: list[Row] = []
    for ref in plan.order[rank]:
        op = schedule.op(ref)
        push = ref in plan.pushes
        kinds = plan.ll_reads[ref]
        srcs = tuple(area(s) if ll else layout.addr(s) for s, ll in zip(op.srcs, kinds))
        mask = int(push) + sum(2 << i for i, ll in enumerate(kinds) if ll)
        rows.append(Row(op.id, op.dst.count, area(op.dst) if push else layout.addr(op.dst), srcs,
                        op.kind == OpKind.REDUCE, op.accumulate, op.scale, (), (), ll=mask))
    for r, i in plan.unpacked:
        op = schedule.rank_ops(r)[i]
        if op.dst.rank == rank:
            rows.append(Row(f"{op.id}:unpack", op.dst.count, layout.addr(op.dst),
                            (area(op.dst),), False, False, 1.0, (), (), ll=2))
    epw = elements_per_word(itemsize)
    grid = opts.ctas or max(1, min(opts.max_ctas, -(-(plan.widest // epw) // LL_STEP_WORDS)))
    launch = KernelLaunch(tuple(rows), grid, _aligned(rows, itemsize))
    slots = 2 * (2 * plan.elements // epw)      # both parities, a word two int32 slots
    return RankProgram(rank, layout, slots, None, {0: (launch,)}, KernelLaunch((), 1, True),
                       schedule.spec.accumulates_output,
                       ("LL: one kernel per call, flags in the data words, no barriers",),
                       (), True, plan.elements, epw, plan.in_place)


COALESCE_BYTES = 64 * 1024   # rows up to this size may defer their signals to the next row


# Reduce rows up to this size take their result copies as more destinations (copy rows at any
# size: `_merge_result_copies`). 2 x H200, two_shot all-reduce, the same grid, merged / not, one
# run (results/gpu/mid-w2/ab-2): 12.4 / 12.9 us at 1 MiB (rows of 512 KiB), 21.6 / 21.5 at 4
# MiB, 809 / 781 at 256 MiB, 3194 / 3080 at 1 GiB: once a reduce streams, its remote reads and
# remote stores go faster in passes of their own than mixed. A copy row has no remote reads:
# all_gather rhd (a self copy, then its push) went 487 -> 383 us at 256 MiB and 1903 -> 1493 at
# 1 GiB merged (large-w2/final against mid-w2/compare, two runs of the same harness). The
# limit lives beside the simulator's copy of the rule (`sim/row_merge`), which times it.


def _merge_result_copies(rows: list[Row], itemsize: int, rank: int) -> list[Row]:
    """Fold a copy of a row's result into that row: the copy's destination becomes one more
    destination the row stores each step's result to (`Row.also`). E.g. two_shot's reduce of
    its shard, then the push of that shard to every peer: the pushes' stores leave as each step
    is reduced, instead of after a CTA barrier, a header round trip and a re-read of the shard
    per peer (2 x H200, 1 MiB: the push row took 2.2 us after the reduce, results/gpu/
    mid-w2/mid_trace-ar-trace.json). Reduce rows only up to MERGE_MAX_BYTES (measured above).

    Only where the CTAs already order the two rows by themselves: the copy comes next in the
    launch, reads exactly the row's destination (same region, count and CTAs, so each element
    is copied by the thread that computed it), and waits for nothing (the lowering dropped its
    dependency on the row as CTA-local, `_cta_local`; `_clobbers` checks again that it writes
    nothing the row touches elsewhere). Its signals move onto the row and leave after both
    stores, under the same release. Past MERGE_MAX_BYTES only copy rows of this rank's own
    memory merge: a pulled copy mixes remote reads and stores like a reduce."""
    out: list[Row] = []
    for row in rows:
        p = out[-1] if out else None
        if (p is not None and p.dst is not None and p.count > 0
                and (p.count * itemsize <= MERGE_MAX_BYTES
                     or not p.reduce and all(s.rank == rank for s in p.srcs))
                and not _clobbers(row.dst, p)
                and not p.ll and not row.ll
                and not row.reduce and not row.accumulate and row.scale == 1.0
                and not row.waits and not row.relaxed and not p.relaxed
                and row.dst is not None and row.srcs == (p.dst,) and row.count == p.count
                and row.ctas == p.ctas):
            out[-1] = replace(p, also=(*p.also, row.dst), signals=p.signals + row.signals)
        else:
            out.append(row)
    return out


def _clobbers(dst: Addr | None, p: Row) -> bool:
    """Would stores to `dst` (a copy folded into row `p`, stored as each step of `p` is
    computed) meet a region `p` reads or writes other than element for element?"""
    if dst is None or p.dst is None:
        return True
    return any(a.rank == dst.rank and a != dst
               and a.offset < dst.offset + p.count and dst.offset < a.offset + p.count
               for a in (*p.srcs, p.dst, *p.also))


def _coalesce_signals(rows: list[Row], itemsize: int) -> list[Row]:
    """Move a small row's signals onto the next row of the launch when that row waits for
    nothing: they then leave together behind one release fence (each fence waits for the CTA's
    outstanding stores to land, about a microsecond over NVLink) instead of one fence per row.
    A consumer sees the data no later than one small row afterwards; big rows keep their own
    signals so a pipeline's consumer can start while the next chunk moves."""
    out = list(rows)
    for i in range(len(out) - 1):
        row, nxt = out[i], out[i + 1]
        if (row.signals and not nxt.waits and row.count * itemsize <= COALESCE_BYTES
                and row.ctas == nxt.ctas):
            out[i + 1] = replace(nxt, signals=row.signals + nxt.signals)
            out[i] = replace(row, signals=())
    return out


def _fusable(g: _Global, opts: CudaOptions) -> bool:
    """One launch per call needs one stream and no copy-engine or net ops, on every rank (the
    barrier slots count CTAs, so all ranks must lower the same way)."""
    return (opts.single_stream and opts.fuse and not opts.launch_per_op
            and all(e == Engine.SM for e in g.engines.values()))


def _fused(g: _Global, w: int, rank: int, layout: SymmetricLayout,
           streams: dict[int, list[Launch]], copy_in_output: bool,
           notes: list[str]) -> RankProgram:
    """Start barrier + every op row + end barrier in one launch of `g.grid` CTAs: one kernel
    per call (the latency floor of small all-reduces is launches, not bytes). Each row costs a
    chain of dependent memory round trips (profiled on an H200), so the barriers ride on the op
    rows: the first op row also waits for every start arrival, the last also signals the end
    arrival; only the start arrival and the end wait remain rows of their own.

    Two arrivals need no release (`Row.relaxed`): the start arrival is the launch's first row,
    so no store of this kernel precedes it (what it announces, the input and the previous
    call's copy-out, was done by earlier work on the stream, complete in this GPU's memory at
    the kernel boundary); and the end arrival where every row stores into this rank's own
    memory: it then only says that this rank's reads of its peers are done (the CTA barrier
    before a row's signals waits for them), and no peer reads what it stored."""
    rows: list[Row] = []
    for items in streams.values():
        for item in items:
            assert isinstance(item, KernelLaunch)
            rows.extend(item.rows)
    # the start arrival says only that this rank's kernel started (what it announces was done by
    # earlier stream work), so one CTA's arrival says it for all: CTA 0 alone arrives and the
    # waits need one arrival per rank, not one per CTA (fewer atomics on one slot)
    s_arrive, s_wait = _barrier(g, w, rank, 0, "start", 1).rows
    e_arrive, e_wait = _barrier(g, w, rank, 1, "end", g.grid).rows
    s_arrive = replace(s_arrive, relaxed=True, ctas=(0, 1) if g.grid > 1 else None)
    local_only = all(a.rank == rank for r in rows for a in (r.dst, *r.also) if a is not None)
    if rows:
        # the barriers ride on the first and last rows where every CTA runs them
        head, tail = [s_arrive], [e_wait]
        if rows[0].ctas is None:
            rows[0] = replace(rows[0], waits=s_wait.waits + rows[0].waits)
        else:
            head.append(s_wait)
        if rows[-1].ctas is None:
            rows[-1] = replace(rows[-1], signals=rows[-1].signals + e_arrive.signals,
                               relaxed=local_only and not rows[-1].signals)
        else:
            tail.insert(0, replace(e_arrive, relaxed=local_only))
        rows = [*head, *rows, *tail]
    else:
        rows = [s_arrive, s_wait, replace(e_arrive, relaxed=True), e_wait]
    aligned = all(isinstance(x, KernelLaunch) and x.aligned
                  for items in streams.values() for x in items)
    launch = KernelLaunch(tuple(rows), g.grid, aligned)
    notes = [*notes, "fused: one kernel per call (barriers are rows of it)"]
    return RankProgram(rank, layout, g.num_slots(w), None, {0: (launch,)},
                       KernelLaunch((), 1, True), copy_in_output, tuple(notes), (), True)


def _waits(g: _Global, op: Op, ended: Container[OpRef] = ()) -> list[Wait]:
    """What `op` waits for: its dependencies (but those its CTAs order themselves, and those in
    `ended`: launched before it on its stream, so over at its launch), and its plan-channel
    predecessor where a stream cannot order the two."""
    refs = [d for d in op.deps if (op.ref, d) not in g.local]
    p = g.explicit_prev(op.ref)
    if p is not None:
        refs.append(p)
    return [g.wait_on(d) for d in refs if d not in ended]


def _signals(g: _Global, op: Op) -> tuple[Signal, ...]:
    return tuple(Signal(c, g.slot(op.ref)) for c in sorted(g.consumers.get(op.ref, ())))


def _net_stream(schedule: Schedule, g: _Global, layout: SymmetricLayout,
                rank: int) -> tuple[Launch, ...]:
    """This rank's sends and receives, in one global order that extends every dependency (so
    the per-pair FIFO matching of NCCL pairs them up and no wait can block an earlier op). With
    NVSHMEM, only the sender has work: the put, which waits for its dependencies itself."""
    if Engine.NET not in g.engines.values():
        return ()
    out: list[Launch] = []
    for level in levels(schedule).levels:
        for op in level:
            if g.engines[op.ref] != Engine.NET:
                continue
            src, dst = op.srcs[0], op.dst
            if op.ref in g.net_slots:
                if src.rank == rank and not g.inline_puts:
                    out.extend(_put(g, layout, op))
                continue
            if src.rank == rank:
                out.append(_wait_launch(op.id, _waits(g, op)))
                out.append(SendLaunch(op.id, layout.addr(src), op.dst.count, dst.rank))
            if dst.rank == rank:
                out.append(RecvLaunch(op.id, layout.addr(dst), op.dst.count, src.rank))
                out.append(_signal_launch(op.id, _signals(g, op)))
    return tuple(out)


def _wait_launch(op_id: str, waits: Sequence[Wait]) -> KernelLaunch:
    """A one-CTA launch that only waits: what orders a copy-engine copy, an NCCL send or an
    NVSHMEM put (work outside the row kernel) after the op's dependencies."""
    return KernelLaunch((Row(f"{op_id}:wait", 0, None, (), False, False, 1.0, tuple(waits), ()),),
                        1, True)


def _signal_launch(op_id: str, signals: Sequence[Signal]) -> KernelLaunch:
    """A one-CTA launch that only signals: announces work outside the row kernel (a copy-engine
    copy, an NCCL receive) to the op's consumers."""
    return KernelLaunch((Row(f"{op_id}:signal", 0, None, (), False, False, 1.0, (),
                             tuple(signals)),), 1, True)


def _put(g: _Global, layout: SymmetricLayout, op: Op,
         ended: Container[OpRef] = ()) -> tuple[Launch, ...]:
    """The sender's NVSHMEM put of `op`, waiting in its own kernel for what it reads (one launch:
    the threads that read the data are the ones that acquired it), but not for `ended` (inline:
    the sender's ops launched before it on its one stream, over when it starts). The receiver
    is signalled first (with the data); every other consumer after."""
    src, dst = op.srcs[0], op.dst
    targets = sorted(g.consumers.get(op.ref, ()), key=lambda c: (c != dst.rank, c))
    if dst.rank not in targets:
        targets.insert(0, dst.rank)
    return (PutLaunch(op.id, layout.addr(src), layout.addr(dst), op.dst.count, dst.rank,
                      tuple(Signal(c, g.slot(op.ref)) for c in targets), g.put_ctas[op.ref],
                      tuple(_waits(g, op, ended))),)


def _barrier(g: _Global, world: int, rank: int, which: int, name: str,
             ctas: int = 1) -> KernelLaunch:
    """Every rank's `ctas` CTAs arrive at every rank, then wait for all arrivals."""
    first = g.num_ops + which * world
    arrive = Row(f"barrier:{name}:arrive", 0, None, (), False, False, 1.0, (),
                 tuple(Signal(q, first + rank) for q in range(world)))
    wait = Row(f"barrier:{name}:wait", 0, None, (), False, False, 1.0,
               tuple(Wait(first + q, ctas, f"barrier:{name}@{q}") for q in range(world)), ())
    return KernelLaunch((arrive, wait), ctas, True)
