"""The replay loop over flat tables, compiled with numba (on first call, then cached on disk).

The same algorithm as `sim/engine.py` + `sim/fluid.py`, step for step, so the Python engine
stays its oracle: channels are cursors over their ops, an event heap orders events by time, an
instant is every event within fluid.INSTANT_RTOL of its first, run at that time in (channel,
begin before end) order, every instant ends with one max-min re-solve of the component its
changes can reach, a link that cannot fill is left out, and a re-solved rate within RATE_RTOL
keeps its pending wake-up. (The Python engine's heap breaks ties of time by a sequence number;
that order is never seen: a round takes every event up to the instant's end and sorts them by
(channel, kind), and a channel has one pending event.)

What differs is only representation. A channel runs one op at a time, so it owns at most one
flow: flow state is per channel, and a flow's place on a link's member list is the node
`channel * max_links + k` (its k-th link), linked both ways so a flow leaves a link in O(1); a
list is in the order its flows started (appended at the tail: the head's `node_prev` is the
tail), as the Python engine's dicts are. Scratch marks are stamped with a per-settle counter
instead of cleared. What the Python engine keeps in insertion-ordered dicts is walked here in
the same order, so the two do the same arithmetic in the same order. A channel's running op
and its flow's links are kept per channel (`ch_op`; the (link, weight) pairs copied from the
shape's rows into the channel's nodes, `nd_lid` / `nd_w`, `ch_nl` of them): the per-op rows of
a 33M-op run and the shape rows of a 2M-pair `hier` are read once an op, not at every visit of
its flow (each visit a cache miss: 117 -> 101 CPU s on the 4096-GPU `hier` replay).

An instant ahead, the loop prefetches what the heap's next events will read (`look`): a
channel's next event comes thousands of instants after its last, so its op's rows, key and shape
rows and its next op's first dependency are in no cache by then (on the 4096-GPU `hier`, chains
of DRAM misses were half of the events' cost; replay 121.6 / 131.4 -> 111.8 / 107.9 CPU s in
alternating runs, the bench row 147.3 -> 138.8: bench/results/sim_scale.md). A transfer keeps
the next op's row, key and dependencies' rows per channel (`stash`), so the prefetches at its
end, and the op's start, read channel state. Prefetches are hints: nothing else changes.

The event heap holds a channel's one pending event (its op's begin or its flow's wake-up) in
place (`pos`: its slot): a flow whose rate changes has its wake-up moved, where the Python
engine pushes another and leaves the old one stale (on the 4096-GPU `hier`, 41M of 113M pops,
and a heap twice as deep). A stale wake-up opens no instant with the local re-solve on
(`EventClock.void`), so it is not kept; with whole re-solves it still opens one at its time, so
its time goes to a second heap of times alone (`gk`) that instants open from too.

Every piece of state lives in the arrays passed in, so the loop can return and be resumed: after
`stop_instants` instants (the caller reports progress) or when the heap of stale wake-ups might
overflow (the caller doubles it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hiercoll.sim.config import EPS_BYTES, RATE_RTOL, SATURATED_RTOL
from hiercoll.sim.fluid import HEAP_ABOVE_LINKS, INSTANT_RTOL, LOCAL_ROUNDS, QUIET_MARGIN, SLACK_MARGIN

# st[] slots: the loop's scalars (closures may mutate arrays, not the variables they capture)
HSIZE, GSIZE, NDIRTY, NENDED, INSTANTS, STAMP, NREADY, INIT = range(8)   # GSIZE: stale wake-ups
LOUD, NSTARTED = 8, 9     # this instant's changes may move a rate; flows started this instant
NSEEDS, SID = 10, 11      # links near full an ended flow left (or re-capped); local solve's id
LOCAL_ON = 12             # 1: quiet instants skipped, local re-solves (fluid.local_resolve())
# counts (diagnostics): re-solves by path, and the local ones' rounds, flows and links filled
N_QUIET, N_LOCAL, N_WHOLE, N_ROUNDS, N_SETFLOWS, N_WHOLEFLOWS, N_SETLINKS, N_WALKED = range(13, 21)
N_STALE, N_EMPTYBEGIN, N_SETRATE, N_EVENTS = range(21, 25)
LOCAL_FILL = 25   # 1 while a local problem is filled: links' members are the set's (lhead)
N_BIG, N_BIGFLOWS = 26, 27      # local rounds filled by heap (past HEAP_ABOVE_LINKS links), their flows
N_STATE = 28
BEGIN, FINISH = 0, 1
DONE, PAUSED, GROW = 0, 1, 2
NONE, HEAP, OUTSIDE = 0, 1, 2      # fill_heap: where the lowest entry is
TINY_WEIGHT = 1e-12       # fluid.py's "no weight left on this link"
# op_wait[op]: the last channel parked on op (its waiters' list, newest first; -1: none), or
# ENDED: one array read and written where an ended flag and a list head were two
ENDED = -2

F = TypeVar("F", bound=Callable[..., Any])


def _no_nrt_options() -> dict[str, Any]:
    """`_nrt=False` where this numba knows the option: it is private (a numba that dropped it
    would refuse the whole function at its first call), so without it the loop compiles with
    reference counting on: the same results, a fifth slower."""
    from numba.core.cpu import CPUTargetOptions
    return {"nogil": True, **({"_nrt": False} if hasattr(CPUTargetOptions, "_nrt") else {})}


NO_NRT: dict[str, Any] = _no_nrt_options()


def _jit(fn: F) -> F:
    """numba.njit, cached on disk where the package's __pycache__ (or numba's user-wide cache)
    is writable, else compiled in memory once per process. Without numba's reference counting
    (`_nrt=False`): the loop allocates nothing (its scratch comes in as arrays), and the atomic
    increments and decrements numba puts around arrays that closures and inlined helpers use
    were a fifth of a ring's replay."""
    try:
        return cast(F, numba.njit(cache=True, **NO_NRT)(fn))
    except RuntimeError:        # numba found no writable cache location
        return cast(F, numba.njit(**NO_NRT)(fn))


def _llvm_major() -> int:
    from llvmlite import binding
    return int(binding.llvm_version_info[0])


def _inline(fn: F) -> F:
    """numba.njit inlined into its callers' IR (compiled with the caller's options: no
    reference counting; a call of a separately compiled function would hold a reference to
    each array it passes)."""
    return cast(F, numba.njit(inline="always", nogil=True)(fn))


# the intrinsic's name is mangled by its pointer type: opaque pointers from LLVM 15 (numba 0.6x
# with llvmlite >= 0.44), typed i8* before (numba 0.60's LLVM 14)
_PREFETCH = ("llvm.prefetch.p0" if _llvm_major() >= 15 else "llvm.prefetch.p0i8")


def _prefetch_typer(typingctx: Any, arr: Any, idx: Any) -> Any:
    """_prefetch(arr, idx): start loading arr[idx]'s cache line (llvm.prefetch: a hint, never
    a fault, so an index past the end is harmless); the loop reads it an instant later."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(  # type: ignore[no-untyped-call]
            context, builder, aryty, ary, [args[1]], wraparound=False)
        ptr = builder.bitcast(ptr, ir.IntType(8).as_pointer())     # one declaration, any array
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]), _PREFETCH)
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])       # read, every cache level, data
        return context.get_dummy_value()
    return types.void(arr, idx), codegen


_prefetch = cast(Callable[[Any, int], None], intrinsic(_prefetch_typer))


@_inline
def _eplace(hk: Any, hp: Any, pos: Any, i: int, key: float, p: int) -> None:
    """Entry (key, p) at slot i of the event heap; its channel's `pos` follows it."""
    hk[i] = key
    hp[i] = p
    pos[p >> 1] = i


@_inline
def _erise(hk: Any, hp: Any, pos: Any, i: int, key: float, p: int) -> None:
    """Put (key, p) in the hole at i, moving it up past larger parents."""
    while i > 0:
        parent = (i - 1) >> 1
        if hk[parent] <= key:
            break
        _eplace(hk, hp, pos, i, hk[parent], hp[parent])
        i = parent
    _eplace(hk, hp, pos, i, key, p)


@_inline
def _emove(hk: Any, hp: Any, pos: Any, n: int, i: int, key: float, p: int) -> None:
    """Put (key, p) in the hole at i of a heap of n entries, whose old key hk[i] still holds.
    Moving down, the hole goes to a leaf by the smaller child (one comparison a level, without
    a branch: hk[n] is +inf), then the entry rises from there: most rise no step, so it costs
    half the comparisons of a sift-down."""
    if key < hk[i]:
        _erise(hk, hp, pos, i, key, p)
        return
    c = 2 * i + 1
    while c < n:
        c += int(hk[c + 1] < hk[c])
        _eplace(hk, hp, pos, i, hk[c], hp[c])
        i = c
        c = 2 * i + 1
    _erise(hk, hp, pos, i, key, p)


@_inline
def _eremove(hk: Any, hp: Any, pos: Any, n: int, i: int) -> int:
    """Drop the event heap's entry at i (the root: a pop; read it first); returns the new
    size. The slots past the end hold +inf."""
    n -= 1
    pos[hp[i] >> 1] = -1
    key, p = hk[n], hp[n]
    hk[n] = np.inf
    if i < n:
        _emove(hk, hp, pos, n, i, key, p)
    return n


@_inline
def _grise(gk: Any, i: int, key: float) -> None:
    """Put `key` in the hole at i of the stale wake-ups' heap (times alone), moving it up."""
    while i > 0:
        parent = (i - 1) >> 1
        if gk[parent] <= key:
            break
        gk[i] = gk[parent]
        i = parent
    gk[i] = key


@_inline
def _gpush(gk: Any, n: int, key: float) -> int:
    """Push a stale wake-up's time; returns the new size."""
    _grise(gk, n, key)
    return n + 1


@_inline
def _gpop(gk: Any, n: int) -> int:
    """Drop the stale wake-ups' heap's root; returns the new size (slots past the end: +inf)."""
    n -= 1
    key = gk[n]
    gk[n] = np.inf
    if n == 0:
        return 0
    i = 0
    c = 1
    while c < n:
        c += int(gk[c + 1] < gk[c])
        gk[i] = gk[c]
        i = c
        c = 2 * i + 1
    _grise(gk, i, key)
    return n


@_inline
def _lsift_at(fk: Any, fs: Any, n: int, i: int, key: float, lid: int) -> None:
    """Place (key, lid) at slot i of the link heap (free) and sift it down; the heap is ordered
    by (key, lid), so its entries come off in one order however it was built."""
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (fk[c + 1] < fk[c] or (fk[c + 1] == fk[c] and fs[c + 1] < fs[c])):
            c += 1
        if key < fk[c] or (key == fk[c] and lid < fs[c]):
            break
        fk[i], fs[i] = fk[c], fs[c]
        i = c
    fk[i], fs[i] = key, lid


@_inline
def _lpop(fk: Any, fs: Any, n: int) -> int:
    """Drop the link heap's root (read it first); returns the new size."""
    n -= 1
    if n > 0:
        _lsift_at(fk, fs, n, 0, fk[n], fs[n])
    return n


@_inline
def _insertion_run(bp: Any, lo: int, hi: int) -> None:
    """Sort bp[lo:hi] in place."""
    for i in range(lo + 1, hi):
        p = bp[i]
        j = i - 1
        while j >= lo and bp[j] > p:
            bp[j + 1] = bp[j]
            j -= 1
        bp[j + 1] = p


@_inline
def _sort_round(bp: Any, tp: Any, n: int) -> None:
    """Sort a round's events (channel * 2 + kind, each once) in place: insertion sorted runs
    of 32, merged bottom-up through the scratch tp (no allocation: the loop runs without
    numba's reference counting)."""
    for lo in range(0, n, 32):
        _insertion_run(bp, lo, min(lo + 32, n))
    width = 32
    src, dst = bp, tp
    swapped = False
    while width < n:
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j = lo, mid
            for k in range(lo, hi):
                if i < mid and (j >= hi or src[i] <= src[j]):
                    dst[k] = src[i]
                    i += 1
                else:
                    dst[k] = src[j]
                    j += 1
        src, dst = dst, src
        swapped = not swapped
        width *= 2
    if swapped:
        for k in range(n):
            bp[k] = tp[k]


@_jit
def replay(op_key: Any, key_shape: Any, key_delay: Any, op_nbytes: Any, dep_ptr: Any, dep_idx: Any,
            op_start: Any, op_end: Any, op_wait: Any,
            ch_ptr: Any, ch_ops: Any, ch_i: Any, ch_d: Any, ch_wait_next: Any, ch_op: Any, ch_shape: Any,
            fl_rate: Any, fl_rem: Any, fl_tref: Any, fl_ceil: Any,
            fl_stamp: Any, fl_rated: Any, fl_new: Any,
            sh_ptr: Any, sh_lid: Any, sh_w: Any, max_links: int,
            alone: Any, crowded: Any, cap: Any, slack_below: Any, weight: Any, demand: Any,
            ubytes: Any, busy_us: Any, busy_since: Any, active: Any, head: Any,
            node_next: Any, node_prev: Any,
            dirty: Any, dirty_list: Any, seen: Any, incomp: Any, done: Any,
            ws: Any, rem: Any, left: Any, at: Any,
            hk: Any, hp: Any, pos: Any, gk: Any, rounds: Any, fk: Any, fs: Any,
            ready: Any, lstack: Any, act: Any, comp_flows: Any, comp_links: Any, full: Any,
            used: Any, extra: Any, started: Any, seeds: Any, seedmark: Any, fl_in: Any, lseen: Any, lcount: Any,
            pcap: Any, lold: Any, mixed: Any, fl_bot: Any, lhead: Any, ltail: Any, lnext: Any,
            nd_lid: Any, nd_w: Any, ch_nl: Any, ch_next: Any, ch_nkey: Any, ch_nbytes: Any,
            ch_ndep: Any, ch_ndend: Any,
            st: Any, tnow: Any, ch_identity: bool, stop_instants: int, rate_scale: float = 1.0) -> int:
    """Run the event loop until the heap is empty (DONE), `stop_instants` instants have run
    (PAUSED) or the stale wake-ups' heap might overflow this instant (GROW). numba compiles it on first call
    (the closures are inlined).

    `rate_scale` multiplies every rate the max-min filling gives, as bench/sim_rounding.py's
    wrapper of `fluid.max_min_rates` does for the Python engine (how far a change of rounding's
    size moves the times); left out, it is 1.0, which leaves every rate as it is."""
    n_ch = len(ch_i)

    def op_at(c: int, j: int) -> int:
        """Channel c's j-th op; with `ch_identity` (one channel a rank) its position is its row,
        so the per-op ch_ops is not read at all."""
        if ch_identity:
            return int(ch_ptr[c] + j)
        return int(ch_ops[ch_ptr[c] + j])

    def next_op(c: int) -> int:
        """The op after channel c's current one, -1 where it is the last."""
        j = ch_i[c] + 1
        return op_at(c, j) if j < ch_ptr[c + 1] - ch_ptr[c] else -1

    def stash(c: int, j: int) -> None:
        """Keep channel c's j-th op's row, key, bytes and dependencies' rows on the channel
        (row -1: no such op); `drain` and `transfer` start it from there and `look` prefetches
        from there. Its per-op rows are read once, here, where `look` has just prefetched them
        (read again when the op started, thousands of instants later, they were cache misses
        again). With the in-place event heap, the 4096-GPU `hier` replay went 77.4 / 72.4 ->
        58.1 / 54.7 CPU s in alternating runs."""
        if j < ch_ptr[c + 1] - ch_ptr[c]:
            op = op_at(c, j)
            ch_next[c] = op
            ch_nkey[c] = op_key[op]
            ch_nbytes[c] = op_nbytes[op]
            ch_ndep[c] = dep_ptr[op]
            ch_ndend[c] = dep_ptr[op + 1]
        else:
            ch_next[c] = -1
            ch_nkey[c] = -1
            ch_nbytes[c] = 0.0
            ch_ndep[c] = 0
            ch_ndend[c] = 0

    def look(j: int, deep: bool) -> None:
        """Prefetch what heap entry j's event will read. A channel's next event comes thousands
        of instants after its last, so its op's rows, key and links are in no cache by then
        (on the 4096-GPU `hier`, chains of DRAM misses were half of an event's cost); an
        instant ahead (the heap's top and its children: the next instants' likely first
        events), every miss but the first of a chain is hidden. `deep`: the top, whose first
        misses were prefetched an instant ago as a child: the rows they point to."""
        if j >= st[HSIZE]:
            return
        p = hp[j]
        c = p >> 1
        if p & 1 == BEGIN:                      # transfer: the op's bytes and links, the
            s = ch_shape[c]                     # next op's rows (for the stash)
            if deep:
                a, b = sh_ptr[s], sh_ptr[s + 1]
                if a < b:
                    _prefetch(sh_lid, a)
                    _prefetch(sh_w, a)
                    _prefetch(sh_lid, b - 1)
                    _prefetch(sh_w, b - 1)
                nxt = next_op(c)
                if nxt >= 0:
                    _prefetch(dep_ptr, nxt)
                    _prefetch(op_key, nxt)
                    _prefetch(op_nbytes, nxt)
            else:
                _prefetch(sh_ptr, s)
                if not ch_identity:
                    _prefetch(ch_ops, ch_ptr[c] + ch_i[c] + 1)
        else:                                   # finish: the op's rows, the next op's
            key, dp = ch_nkey[c], ch_ndep[c]          # start, key and first dependency
            if deep:
                if dp < ch_ndend[c] and dep_idx[dp] >= 0:
                    _prefetch(op_wait, dep_idx[dp])
                if key >= 0:
                    _prefetch(sh_ptr, key_shape[key])
            else:
                op = ch_op[c]
                _prefetch(op_wait, op)
                _prefetch(op_end, op)
                _prefetch(op_start, ch_next[c])
                _prefetch(dep_idx, dp)
                if key >= 0:
                    _prefetch(key_shape, key)
                    _prefetch(key_delay, key)

    def push_event(t: float, kind: int, c: int) -> None:
        _erise(hk, hp, pos, st[HSIZE], t, c * 2 + kind)
        st[HSIZE] += 1

    def mark_dirty(lid: int) -> None:
        if dirty[lid] == 0:
            dirty[lid] = 1
            dirty_list[st[NDIRTY]] = lid
            st[NDIRTY] += 1

    def add_seed(lid: int) -> None:
        """FluidNetwork._seeds (a dict: each link once, in the order first marked)."""
        if seedmark[lid] == st[INSTANTS] + 1:
            return
        seedmark[lid] = st[INSTANTS] + 1
        seeds[st[NSEEDS]] = lid
        st[NSEEDS] += 1

    def set_capacity(lid: int, c: float) -> None:
        cap[lid] = c
        st[LOUD] = 1
        add_seed(lid)
        slack_below[lid] = c * (1.0 - SLACK_MARGIN)

    def drain() -> None:
        """engine.run_timing's drain: pop channels (a stack), start the ones whose next op has
        every dependency ended, park the others on the first dependency still running."""
        while st[NREADY] > 0:
            st[NREADY] -= 1
            c = ready[st[NREADY]]
            op = ch_next[c]
            if op < 0:
                continue
            blocked = False
            first = ch_ndep[c]
            while ch_d[c] < ch_ndend[c] - first:
                d = dep_idx[first + ch_d[c]]
                if d < 0:            # an op that does not exist: waits forever (a deadlock)
                    blocked = True
                    break
                w = op_wait[d]
                if w != ENDED:           # parked: pushed on the front of d's waiters
                    ch_wait_next[c] = w
                    op_wait[d] = c
                    blocked = True
                    break
                ch_d[c] += 1
            if not blocked:
                now = tnow[0]
                op_start[op] = now
                key = ch_nkey[c]
                ch_op[c] = op              # the running op and its shape, per channel: read
                ch_shape[c] = key_shape[key]   # here once, not from the per-op rows each time
                push_event(now + key_delay[key], BEGIN, c)

    def finished(c: int) -> None:
        op = ch_op[c]
        op_end[op] = tnow[0]
        st[NENDED] += 1
        ch_i[c] += 1
        ch_d[c] = 0
        ready[st[NREADY]] = c
        st[NREADY] += 1
        # op's waiters go on the stack in the order they parked (the list is newest first)
        w = op_wait[op]
        op_wait[op] = ENDED
        m = 0
        x = w
        while x >= 0:
            m += 1
            x = ch_wait_next[x]
        j = st[NREADY] + m - 1
        while w >= 0:
            ready[j] = w
            j -= 1
            w = ch_wait_next[w]
        st[NREADY] += m
        drain()

    def transfer(c: int) -> bool:
        """FluidNetwork.transfer for channel c's current op; False: nothing to move."""
        nbytes = ch_nbytes[c]                # stashed with the op, as the rows below are
        s = ch_shape[c]
        a, b = sh_ptr[s], sh_ptr[s + 1]
        stash(c, ch_i[c] + 1)
        if nbytes <= EPS_BYTES or a == b:
            return False
        now = tnow[0]
        ceiling = np.inf
        base = c * max_links                 # the flow's links, copied to its channel's nodes:
        for k in range(a, b):                # read there from now on (the shapes' rows are
            lid, w = sh_lid[k], sh_w[k]      # 2 million pairs' on a 4096-GPU `hier`: far
            nd_lid[base + k - a] = lid       # from any cache)
            nd_w[base + k - a] = w
            x = alone[lid] / w
            if x < ceiling:
                ceiling = x
        ch_nl[c] = b - a
        fl_rem[c] = nbytes
        fl_rate[c] = 0.0
        fl_tref[c] = now
        fl_ceil[c] = ceiling
        for node in range(base, base + b - a):
            lid, w = nd_lid[node], nd_w[node]
            h = head[lid]                       # appended at the tail (the head's prev)
            node_next[node] = -1
            if h >= 0:
                tail = node_prev[h]
                node_next[tail] = node
                node_prev[node] = tail
                node_prev[h] = node
            else:
                head[lid] = node
                node_prev[node] = node
            weight[lid] += w
            if crowded[lid] > 0.0 and active[lid] == 1:
                set_capacity(lid, crowded[lid])
            ubytes[lid] += w * nbytes
            if active[lid] == 0:
                busy_since[lid] = now
            active[lid] += 1
            demand[lid] += w * ceiling
            mark_dirty(lid)
        started[st[NSTARTED]] = c
        st[NSTARTED] += 1
        return True

    def finish(c: int) -> None:
        """FluidNetwork._finish: channel c's flow leaves its links."""
        now = tnow[0]
        ceiling = fl_ceil[c]
        base = c * max_links
        for node in range(base, base + ch_nl[c]):
            lid, w = nd_lid[node], nd_w[node]
            p, q = node_prev[node], node_next[node]
            h = head[lid]
            if node == h:                       # p: the tail (the node itself if alone)
                head[lid] = q
            else:
                node_next[p] = q
            if q >= 0:
                node_prev[q] = p
            elif node != h:                     # the tail left: the head's prev moves back
                node_prev[h] = p
            on = active[lid] > 1                    # flows left on the link
            if on and used[lid] > cap[lid] * (1.0 - QUIET_MARGIN):
                st[LOUD] = 1                        # others may take what it leaves
                add_seed(lid)
            used[lid] = used[lid] - w * fl_rate[c] if on else 0.0
            weight[lid] = weight[lid] - w if on else 0.0
            if crowded[lid] > 0.0 and active[lid] == 2:
                set_capacity(lid, alone[lid])
            active[lid] -= 1
            if active[lid] == 0:
                busy_us[lid] += now - busy_since[lid]
            demand[lid] = demand[lid] - w * ceiling if on else 0.0
            mark_dirty(lid)
        fl_rate[c] = 0.0
        fl_rem[c] = 0.0
        finished(c)

    def freeze(f: int, level: float, stamp: int, by_heap: bool, b: int) -> None:
        """Fix flow f's rate at `level` (b: the link it froze on); its weight leaves every
        link of the problem."""
        fl_rated[f] = stamp
        fl_new[f] = level
        fl_bot[f] = b
        s = f * max_links
        for k in range(s, s + ch_nl[f]):
            l2 = nd_lid[k]
            if incomp[l2] == stamp:
                if by_heap:
                    left[l2] -= (level - at[l2]) * ws[l2]
                    at[l2] = level
                ws[l2] -= nd_w[k]

    def freeze_link(lid: int, level: float, stamp: int, by_heap: bool) -> None:
        """Freeze lid's flows not yet frozen: every flow on it (a whole component), or the
        set's, in the set's order (a local problem)."""
        first, after = (lhead, lnext) if st[LOCAL_FILL] != 0 else (head, node_next)
        node = first[lid]
        while node >= 0:
            f = node // max_links
            if fl_rated[f] != stamp:
                freeze(f, level, stamp, by_heap, lid)
            node = after[node]

    def fill_scan(nl: int, stamp: int) -> None:
        """fluid._fill_by_scan: each level, the smallest fill level over every open link."""
        na = 0
        for j in range(nl):
            lid = comp_links[j]
            rem[lid] = pcap[lid]
            if ws[lid] > TINY_WEIGHT:
                act[na] = lid
                na += 1
        level = 0.0
        while na > 0:
            best = np.inf
            for j in range(na):
                lid = act[j]
                x = rem[lid] / ws[lid]
                if x < best:
                    best = x
            level += best
            nb = 0
            for j in range(na):
                lid = act[j]
                rem[lid] -= best * ws[lid]
                if rem[lid] <= SATURATED_RTOL * pcap[lid]:
                    full[nb] = lid
                    nb += 1
            if nb == 0:             # rounding: the minimum link is the bottleneck
                bi = act[0]
                bx = rem[bi] / ws[bi]
                for j in range(1, na):
                    lid = act[j]
                    x = rem[lid] / ws[lid]
                    if x < bx:
                        bx, bi = x, lid
                full[0] = bi
                nb = 1
            for j in range(nb):
                done[full[j]] = stamp
                freeze_link(full[j], level, stamp, False)
            m = 0
            for j in range(na):
                lid = act[j]
                if ws[lid] > TINY_WEIGHT and done[lid] != stamp:
                    act[m] = lid
                    m += 1
            na = m

    def top_is_current(n: int) -> tuple[bool, int]:
        """fluid._fill_by_heap's check of the top entry: (current, heap size)."""
        lid = fs[0]
        w = ws[lid]
        if w <= TINY_WEIGHT:
            return False, _lpop(fk, fs, n)
        cur = at[lid] + max(left[lid], 0.0) / w
        if cur > fk[0]:
            _lsift_at(fk, fs, n, 0, cur, lid)
            return False, n
        return True, n

    def before(a: int, b: int) -> bool:
        """Outside link a pops before b: (key, lid) order."""
        return rem[a] < rem[b] or (rem[a] == rem[b] and a < b)

    def sort_outside(nout: int) -> None:
        """The one-flow links fill_heap leaves out (act[:nout]) in (key, lid) order, the order
        a heap of them pops: key (kept in `rem`, fill_scan's scratch) is capacity over weight,
        as it stays while the link is open. Insertion sorted runs of 16, merged bottom-up
        through `lstack` (settle's traversal stack, free by now)."""
        for j in range(nout):
            lid = act[j]
            rem[lid] = pcap[lid] / ws[lid]
        for lo in range(0, nout, 16):
            for i in range(lo + 1, min(lo + 16, nout)):
                lid = act[i]
                j = i - 1
                while j >= lo and before(lid, act[j]):
                    act[j + 1] = act[j]
                    j -= 1
                act[j + 1] = lid
        width = 16
        src, dst = act, lstack
        swapped = False
        while width < nout:
            for lo in range(0, nout, 2 * width):
                mid, hi = min(lo + width, nout), min(lo + 2 * width, nout)
                i, j = lo, mid
                for k in range(lo, hi):
                    if i < mid and (j >= hi or not before(src[j], src[i])):
                        dst[k] = src[i]
                        i += 1
                    else:
                        dst[k] = src[j]
                        j += 1
            src, dst = dst, src
            swapped = not swapped
            width *= 2
        if swapped:
            for k in range(nout):
                act[k] = lstack[k]

    def lowest(n: int, o: int, nout: int) -> tuple[int, int, int]:
        """The entry a heap of every link would have on top, current: (HEAP: the heap's top,
        OUTSIDE: act[o], NONE), the heap's size, the outside list's next open position."""
        while True:
            while o < nout and ws[act[o]] <= TINY_WEIGHT:    # dropped unseen, as by the heap
                o += 1
            if n > 0:
                heap_first = o == nout
                if not heap_first:
                    l2 = act[o]
                    heap_first = fk[0] < rem[l2] or (fk[0] == rem[l2] and fs[0] < l2)
                if heap_first:
                    ok, n = top_is_current(n)
                    if not ok:
                        continue
                    return HEAP, n, o
            return (OUTSIDE if o < nout else NONE), n, o

    def fill_heap(nl: int, stamp: int) -> None:
        """fluid._fill_by_heap: links wait in a heap by the level at which they fill.

        Links of one flow (most of a problem: each flow's own NIC, PCIe and NVLink port) wait
        outside the heap, in a list sorted once by (key, lid): pushing and popping them was most
        of the filling. Such a link's key stays its capacity over its weight while its flow is
        open (nothing else moves it), and it is dropped once that flow freezes, so the list's
        next open entry is what a heap of them would have on top; the lower of it and the heap's
        current top is the top a heap of every link would have. Keys and lids cannot tie, so
        entries come off in the same order however they are held."""
        n = 0
        nout = 0
        for j in range(nl):
            lid = comp_links[j]
            left[lid] = pcap[lid]
            at[lid] = 0.0
            if ws[lid] > TINY_WEIGHT:
                if active[lid] == 1:
                    act[nout] = lid          # act: fill_scan's scratch, free here
                    nout += 1
                else:
                    fk[n], fs[n] = pcap[lid] / ws[lid], lid
                    n += 1
        for i in range(n // 2 - 1, -1, -1):
            _lsift_at(fk, fs, n, i, fk[i], fs[i])
        sort_outside(nout)
        o = 0
        while True:
            src, n, o = lowest(n, o, nout)
            if src == NONE:
                break
            nfull = 0
            level = 0.0
            while src != NONE:                     # this level's links: the first, then the
                if src == HEAP:                    # links full at it too
                    l2, key = fs[0], fk[0]
                else:
                    l2 = act[o]
                    key = rem[l2]
                if nfull == 0:
                    level = key
                elif (key - level) * ws[l2] > SATURATED_RTOL * pcap[l2]:
                    break
                full[nfull] = l2
                nfull += 1
                if src == HEAP:
                    n = _lpop(fk, fs, n)
                else:
                    o += 1
                src, n, o = lowest(n, o, nout)
            for j in range(nfull):
                b = full[j]
                freeze_link(b, level, stamp, True)
                ws[b] = 0.0

    def set_rate(f: int, rate: float, now: float) -> None:
        """FluidNetwork._set_rate: f's links' `used`, its rate and wake-up."""
        old = fl_rate[f]
        s = f * max_links
        for k in range(s, s + ch_nl[f]):
            lid = nd_lid[k]
            used[lid] += nd_w[k] * (rate - old)
        fl_rate[f] = rate
        st[N_SETRATE] += 1
        i = pos[f]
        if i >= 0:                  # its pending wake-up moves (or goes): the old one is stale
            st[N_STALE] += 1
            if st[LOCAL_ON] == 0:   # ... and with whole re-solves still opens an instant
                st[GSIZE] = _gpush(gk, st[GSIZE], hk[i])
            if rate > 0:
                _emove(hk, hp, pos, st[HSIZE], i, now + max(fl_rem[f], 0.0) / rate, f * 2 + FINISH)
            else:
                st[HSIZE] = _eremove(hk, hp, pos, st[HSIZE], i)
        elif rate > 0:
            push_event(now + max(fl_rem[f], 0.0) / rate, FINISH, f)

    def fill_rates(nl: int, nf: int, stamp: int, whole: bool) -> None:
        """The max-min problem of comp_links[:nl] over comp_flows[:nf] filled (by heap past
        HEAP_ABOVE_LINKS links): each flow's new rate in fl_new, scaled (a flow the filling
        left unrated, bound by no link of the problem, at the highest level reached). `whole`:
        each link's capacity and weight are its own (else the caller set pcap and ws)."""
        if whole:
            for j in range(nl):
                lid = comp_links[j]
                ws[lid] = weight[lid]
                pcap[lid] = cap[lid]
        if nl > HEAP_ABOVE_LINKS:
            fill_heap(nl, stamp)
        else:
            fill_scan(nl, stamp)
        level = 0.0
        for j in range(nf):
            f = comp_flows[j]
            if fl_rated[f] == stamp and fl_new[f] > level:
                level = fl_new[f]
        for j in range(nf):
            f = comp_flows[j]
            fl_new[f] = (fl_new[f] if fl_rated[f] == stamp else level) * rate_scale

    def apply_rates(nf: int) -> None:
        """comp_flows[:nf]: bytes moved at the old rates settled up to now, then the new rates
        (fl_new) set where they moved (the others' pending wake-up is still right)."""
        now = tnow[0]
        for j in range(nf):
            f = comp_flows[j]
            fl_rem[f] -= fl_rate[f] * (now - fl_tref[f])
            fl_tref[f] = now
        for j in range(nf):
            f = comp_flows[j]
            rate = fl_new[f]
            old = fl_rate[f]
            if old > 0 and abs(rate - old) <= RATE_RTOL * old:
                continue
            set_rate(f, rate, now)

    def quiet(ns: int) -> bool:
        """FluidNetwork._quiet: every link of a started flow shared with others has room for
        it at its ceiling (with the other started flows on it); then each runs at its ceiling
        and nothing else is re-solved."""
        ok = True
        last = ns
        for j in range(ns):
            f = started[j]
            s = f * max_links
            for k in range(s, s + ch_nl[f]):
                lid = nd_lid[k]
                if active[lid] > 1:
                    x = extra[lid] + nd_w[k] * fl_ceil[f]
                    extra[lid] = x
                    if used[lid] + x > cap[lid] * (1.0 - QUIET_MARGIN):
                        ok = False
                        break
            if not ok:
                last = j + 1
                break
        for j in range(last):                   # extra back to zero for the next instant
            s = started[j] * max_links
            for k in range(s, s + ch_nl[started[j]]):
                extra[nd_lid[k]] = 0.0
        if not ok:
            return False
        now = tnow[0]
        for j in range(ns):
            f = started[j]
            set_rate(f, fl_ceil[f] * rate_scale, now)
        return True

    def mark_push(marks: Any, lid: int, mark: int, top: int) -> int:
        """Link `lid` onto lstack unless `marks` already holds this pass's `mark` for it."""
        if marks[lid] != mark:
            marks[lid] = mark
            lstack[top] = lid
            top += 1
        return top

    def push(lid: int, sid: int, top: int) -> int:
        return mark_push(lseen, lid, sid, top)

    def local(ns: int) -> bool:
        """FluidNetwork._local: re-solve only the flows whose rates can move (the set grows
        along the rates that change), in the same order, with the same arithmetic."""
        st[SID] += 1
        sid = st[SID]
        nf = 0
        top = 0
        margin = 1.0 - QUIET_MARGIN
        for j in range(ns):
            f = started[j]
            fl_in[f] = sid
            comp_flows[nf] = f
            nf += 1
            s = f * max_links
            for k in range(s, s + ch_nl[f]):
                lid = nd_lid[k]
                if used[lid] > cap[lid] * margin:
                    top = push(lid, sid, top)
        for j in range(st[NSEEDS]):
            top = push(seeds[j], sid, top)
        for _ in range(LOCAL_ROUNDS):
            while top > 0:
                top -= 1
                node = head[lstack[top]]
                while node >= 0:
                    f = node // max_links
                    if fl_in[f] != sid:
                        fl_in[f] = sid
                        comp_flows[nf] = f
                        nf += 1
                    node = node_next[node]
            st[STAMP] += 1
            stamp = st[STAMP]
            nl = 0                            # fillable links of the set, in the order found
            for j in range(nf):
                f = comp_flows[j]
                fl_stamp[f] = stamp
                r = fl_rate[f]
                s = f * max_links
                for k in range(s, s + ch_nl[f]):
                    lid = nd_lid[k]
                    if demand[lid] > slack_below[lid]:
                        w = nd_w[k]
                        node = k
                        lnext[node] = -1
                        if seen[lid] != stamp:
                            seen[lid] = stamp
                            lcount[lid] = 1
                            ws[lid] = w
                            lold[lid] = w * r
                            lhead[lid] = node
                            comp_links[nl] = lid
                            nl += 1
                        else:
                            lcount[lid] += 1
                            ws[lid] += w
                            lold[lid] += w * r
                            lnext[ltail[lid]] = node
                        ltail[lid] = node
            nm = 0                            # mixed links: flows outside on them too
            for j in range(nl):
                lid = comp_links[j]
                incomp[lid] = stamp
                if lcount[lid] == active[lid]:
                    pcap[lid] = cap[lid]
                    ws[lid] = weight[lid]
                    lcount[lid] = -1          # closed
                else:
                    x = cap[lid] - (used[lid] - lold[lid])
                    pcap[lid] = x if x >= 0.0 else 0.0
                    mixed[nm] = lid
                    nm += 1
                    lcount[lid] = 0           # then: 1 where a flow of the set moved on it
            st[N_ROUNDS] += 1
            st[N_SETFLOWS] += nf
            st[N_SETLINKS] += nl
            st[LOCAL_FILL] = 1
            fill_rates(nl, nf, stamp, False)
            st[LOCAL_FILL] = 0
            if nl > HEAP_ABOVE_LINKS:
                st[N_BIG] += 1
                st[N_BIGFLOWS] += nf
            for j in range(nm):
                lold[mixed[j]] = -1.0         # then: the highest rate that froze on it
            for j in range(nf):
                f = comp_flows[j]
                if fl_rated[f] != stamp:
                    return False              # a flow bound by no link of the problem
                r = fl_new[f]
                o = fl_rate[f]
                moved = o <= 0 or abs(r - o) > RATE_RTOL * o
                b = fl_bot[f]
                s = f * max_links
                for k in range(s, s + ch_nl[f]):
                    lid = nd_lid[k]
                    if seen[lid] == stamp and lcount[lid] >= 0:
                        if moved:
                            lcount[lid] = 1
                        if b == lid and r > lold[lid]:
                            lold[lid] = r
            for j in range(nm):
                lid = mixed[j]
                if lcount[lid] > 0 and used[lid] > cap[lid] * margin:
                    top = push(lid, sid, top)
                elif lold[lid] >= 0:
                    bound = lold[lid] * (1.0 + RATE_RTOL)
                    node = head[lid]
                    while node >= 0:
                        f = node // max_links
                        st[N_WALKED] += 1
                        if fl_stamp[f] != stamp and fl_rate[f] > bound:
                            top = push(lid, sid, top)
                            break
                        node = node_next[node]
            if top > 0:
                continue
            apply_rates(nf)
            return True
        return False

    def whole(nd: int) -> None:
        """Re-solve the whole component this instant's changes reach."""
        st[N_WHOLE] += 1
        st[NSEEDS] = 0
        st[STAMP] += 1
        stamp = st[STAMP]
        top = 0
        for j in range(nd):
            lid = dirty_list[j]
            dirty[lid] = 0
            seen[lid] = stamp
            lstack[top] = lid
            top += 1
        st[NDIRTY] = 0
        nf = 0
        nl = 0
        while top > 0:
            top -= 1
            lid = lstack[top]
            if demand[lid] > slack_below[lid]:
                incomp[lid] = stamp
                comp_links[nl] = lid
                nl += 1
            node = head[lid]
            while node >= 0:
                f = node // max_links
                if fl_stamp[f] != stamp:
                    fl_stamp[f] = stamp
                    comp_flows[nf] = f
                    nf += 1
                    s = f * max_links
                    for k in range(s, s + ch_nl[f]):
                        l2 = nd_lid[k]
                        if demand[l2] > slack_below[l2]:
                            top = mark_push(seen, l2, stamp, top)
                node = node_next[node]
        if nf == 0:
            return
        st[N_WHOLEFLOWS] += nf
        fill_rates(nl, nf, stamp, True)
        apply_rates(nf)

    def settle() -> None:
        """FluidNetwork.settle: re-solve the component this instant's changes reach (not at
        all where they are quiet; only the flows whose rates can move where it is local)."""
        nd = st[NDIRTY]
        if nd == 0:
            return
        ns = st[NSTARTED]
        st[NSTARTED] = 0
        loud = st[LOUD]
        st[LOUD] = 0
        if st[LOCAL_ON] != 0:
            if loud == 0 and quiet(ns):
                st[N_QUIET] += 1
            elif local(ns):
                st[N_LOCAL] += 1
            else:
                whole(nd)
                return
            st[NSEEDS] = 0
            for j in range(nd):
                dirty[dirty_list[j]] = 0
            st[NDIRTY] = 0
            return
        whole(nd)

    if st[INIT] == 0:
        st[INIT] = 1
        for c in range(n_ch - 1, -1, -1):      # popped from the end: rank, channel order
            stash(c, 0)
            ready[st[NREADY]] = c
            st[NREADY] += 1
        drain()
    bp, tp = rounds[0], rounds[1]     # one round's events, scratch
    while st[HSIZE] > 0 or st[GSIZE] > 0:
        if st[INSTANTS] >= stop_instants:
            return PAUSED
        if st[GSIZE] + n_ch + 1 >= len(gk):
            return GROW
        t = min(hk[0], gk[0])                    # +inf where a heap is empty
        tnow[0] = t
        end = t + INSTANT_RTOL * max(t, 1.0)     # fluid.instant_end
        while gk[0] <= end:
            st[GSIZE] = _gpop(gk, st[GSIZE])
        while hk[0] <= end:
            n = 0                                # a round: what is pending, then in (channel,
            while hk[0] <= end:                  # begin before end) order
                bp[n] = hp[0]
                n += 1
                st[HSIZE] = _eremove(hk, hp, pos, st[HSIZE], 0)
            _sort_round(bp, tp, n)
            st[N_EVENTS] += n
            for j in range(n):
                p = bp[j]
                c = p >> 1
                if p & 1 == BEGIN:
                    if not transfer(c):
                        st[N_EMPTYBEGIN] += 1
                        finished(c)            # nothing to move: ends at once
                else:
                    finish(c)
        settle()
        st[INSTANTS] += 1
        look(0, True)
        look(1, False)
        look(2, False)
    return DONE
