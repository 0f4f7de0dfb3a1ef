"""The replay loop over flat tables, compiled with numba (on first call, then cached on disk).

The same algorithm as `sim/engine.py` + `sim/fluid.py`, step for step, so the Python engine
stays its oracle: channels are cursors over their ops, an event heap orders (time, sequence), an
instant is every event within fluid.INSTANT_RTOL of its first, run at that time in (channel,
begin before end) order, every instant ends with one max-min re-solve of the component its
changes can reach, a link that cannot fill is left out, and a re-solved rate within RATE_RTOL
keeps its pending wake-up.

What differs is only representation. A channel runs one op at a time, so it owns at most one
flow: flow state is per channel, and a flow's place on a link's member list is the node
`channel * max_links + k` (its k-th link), linked both ways so a flow leaves a link in O(1); a
list is in the order its flows started (appended at the tail: the head's `node_prev` is the
tail), as the Python engine's dicts are. Scratch marks are stamped with a per-settle counter
instead of cleared. What the Python engine keeps in insertion-ordered dicts is walked here in
the same order, so the two do the same arithmetic in the same order.

Every piece of state lives in the arrays passed in, so the loop can return and be resumed: after
`stop_instants` instants (the caller reports progress) or when the event heap might overflow
(the caller doubles it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np

from hiercoll.sim.config import EPS_BYTES, RATE_RTOL, SATURATED_RTOL
from hiercoll.sim.fluid import HEAP_ABOVE_LINKS, INSTANT_RTOL, SLACK_MARGIN

# st[] slots: the loop's scalars (closures may mutate arrays, not the variables they capture)
HSIZE, SEQ, NDIRTY, NENDED, INSTANTS, STAMP, NREADY, INIT = range(8)
N_STATE = 8
BEGIN, FINISH = 0, 1
DONE, PAUSED, GROW = 0, 1, 2
TINY_WEIGHT = 1e-12       # fluid.py's "no weight left on this link"

F = TypeVar("F", bound=Callable[..., Any])


def _jit(fn: F) -> F:
    """numba.njit, cached on disk where the package's __pycache__ (or numba's user-wide cache)
    is writable, else compiled in memory once per process."""
    try:
        return cast(F, numba.njit(cache=True, nogil=True)(fn))
    except RuntimeError:        # numba found no writable cache location
        return cast(F, numba.njit(nogil=True)(fn))


@_jit
def _hpush(hk: Any, hs: Any, hp: Any, hv: Any, n: int, key: float, tie: int, p: int, v: int) -> int:
    """Push onto a binary min-heap ordered by (key, tie); returns the new size."""
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if hk[parent] < key or (hk[parent] == key and hs[parent] < tie):
            break
        hk[i], hs[i], hp[i], hv[i] = hk[parent], hs[parent], hp[parent], hv[parent]
        i = parent
    hk[i], hs[i], hp[i], hv[i] = key, tie, p, v
    return n + 1


@_jit
def _hsift_at(hk: Any, hs: Any, hp: Any, hv: Any, n: int, i: int, key: float, tie: int, p: int,
              v: int) -> None:
    """Place (key, tie, p, v) at slot i (free) and sift it down (heap of size n)."""
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (hk[c + 1] < hk[c] or (hk[c + 1] == hk[c] and hs[c + 1] < hs[c])):
            c += 1
        if key < hk[c] or (key == hk[c] and tie < hs[c]):
            break
        hk[i], hs[i], hp[i], hv[i] = hk[c], hs[c], hp[c], hv[c]
        i = c
    hk[i], hs[i], hp[i], hv[i] = key, tie, p, v


@_jit
def _hsift(hk: Any, hs: Any, hp: Any, hv: Any, n: int, key: float, tie: int, p: int, v: int) -> None:
    """Place (key, tie, p, v) at the root and sift it down (heap of size n, root free)."""
    _hsift_at(hk, hs, hp, hv, n, 0, key, tie, p, v)


@_jit
def _hdown(hk: Any, hs: Any, hp: Any, hv: Any, n: int, i: int) -> None:
    """Sift entry i down (a step of building a heap from an array in O(n))."""
    _hsift_at(hk, hs, hp, hv, n, i, hk[i], hs[i], hp[i], hv[i])


@_jit
def _hpop(hk: Any, hs: Any, hp: Any, hv: Any, n: int) -> int:
    """Drop the root (read it first); returns the new size."""
    n -= 1
    if n > 0:
        _hsift(hk, hs, hp, hv, n, hk[n], hs[n], hp[n], hv[n])
    return n


@_jit
def _sort_round(bp: Any, bv: Any, n: int) -> None:
    """Sort a round's events (bp: channel * 2 + kind, bv: version) by bp, stably: insertion sort
    for the few of most instants, a merge sort's order for a ring step's thousands."""
    if n <= 32:
        for i in range(1, n):
            p, v = bp[i], bv[i]
            j = i - 1
            while j >= 0 and bp[j] > p:
                bp[j + 1], bv[j + 1] = bp[j], bv[j]
                j -= 1
            bp[j + 1], bv[j + 1] = p, v
        return
    order = np.argsort(bp[:n], kind="mergesort")
    sp, sv = bp[:n][order], bv[:n][order]
    bp[:n] = sp
    bv[:n] = sv


@_jit
def replay(op_key: Any, key_shape: Any, key_delay: Any, op_nbytes: Any, dep_ptr: Any, dep_idx: Any,
            op_start: Any, op_end: Any, op_ended: Any, wait_head: Any,
            ch_ptr: Any, ch_ops: Any, ch_i: Any, ch_d: Any, ch_wait_next: Any,
            fl_rate: Any, fl_rem: Any, fl_tref: Any, fl_ceil: Any, fl_ver: Any,
            fl_stamp: Any, fl_rated: Any, fl_new: Any,
            sh_ptr: Any, sh_lid: Any, sh_w: Any, max_links: int,
            alone: Any, crowded: Any, cap: Any, slack_below: Any, weight: Any, demand: Any,
            ubytes: Any, busy_us: Any, busy_since: Any, active: Any, head: Any,
            node_next: Any, node_prev: Any,
            dirty: Any, dirty_list: Any, seen: Any, incomp: Any, done: Any,
            ws: Any, rem: Any, left: Any, at: Any,
            hk: Any, hs: Any, hp: Any, hv: Any, fk: Any, fs: Any, fp: Any, fv: Any,
            ready: Any, lstack: Any, act: Any, comp_flows: Any, comp_links: Any, full: Any,
            st: Any, tnow: Any, stop_instants: int, rate_scale: float = 1.0) -> int:
    """Run the event loop until the heap is empty (DONE), `stop_instants` instants have run
    (PAUSED) or the heap might overflow this instant (GROW). numba compiles it on first call
    (the closures are inlined).

    `rate_scale` multiplies every rate the max-min filling gives, as bench/sim_rounding.py's
    wrapper of `fluid.max_min_rates` does for the Python engine (how far a change of rounding's
    size moves the times); left out, it is 1.0, which leaves every rate as it is."""
    n_ch = len(ch_i)

    def cur_op(c: int) -> int:
        return int(ch_ops[ch_ptr[c] + ch_i[c]])

    def shape(op: int) -> int:
        return int(key_shape[op_key[op]])

    def push_event(t: float, kind: int, c: int, ver: int) -> None:
        st[SEQ] += 1
        st[HSIZE] = _hpush(hk, hs, hp, hv, st[HSIZE], t, st[SEQ], c * 2 + kind, ver)

    def mark_dirty(lid: int) -> None:
        if dirty[lid] == 0:
            dirty[lid] = 1
            dirty_list[st[NDIRTY]] = lid
            st[NDIRTY] += 1

    def set_capacity(lid: int, c: float) -> None:
        cap[lid] = c
        slack_below[lid] = c * (1.0 - SLACK_MARGIN)

    def drain() -> None:
        """engine.run_timing's drain: pop channels (a stack), start the ones whose next op has
        every dependency ended, park the others on the first dependency still running."""
        while st[NREADY] > 0:
            st[NREADY] -= 1
            c = ready[st[NREADY]]
            if ch_i[c] == ch_ptr[c + 1] - ch_ptr[c]:
                continue
            op = cur_op(c)
            blocked = False
            first = dep_ptr[op]
            while ch_d[c] < dep_ptr[op + 1] - first:
                d = dep_idx[first + ch_d[c]]
                if d < 0:            # an op that does not exist: waits forever (a deadlock)
                    blocked = True
                    break
                if op_ended[d] == 0:     # parked: pushed on the front of d's waiters
                    ch_wait_next[c] = wait_head[d]
                    wait_head[d] = c
                    blocked = True
                    break
                ch_d[c] += 1
            if not blocked:
                now = tnow[0]
                op_start[op] = now
                push_event(now + key_delay[op_key[op]], BEGIN, c, 0)

    def finished(c: int) -> None:
        op = cur_op(c)
        op_end[op] = tnow[0]
        op_ended[op] = 1
        st[NENDED] += 1
        ch_i[c] += 1
        ch_d[c] = 0
        ready[st[NREADY]] = c
        st[NREADY] += 1
        # op's waiters go on the stack in the order they parked (the list is newest first)
        w = wait_head[op]
        wait_head[op] = -1
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
        op = cur_op(c)
        nbytes = op_nbytes[op]
        s = shape(op)
        a, b = sh_ptr[s], sh_ptr[s + 1]
        if nbytes <= EPS_BYTES or a == b:
            return False
        now = tnow[0]
        ceiling = np.inf
        for k in range(a, b):
            x = alone[sh_lid[k]] / sh_w[k]
            if x < ceiling:
                ceiling = x
        fl_rem[c] = nbytes
        fl_rate[c] = 0.0
        fl_tref[c] = now
        fl_ceil[c] = ceiling
        for k in range(a, b):
            lid, w = sh_lid[k], sh_w[k]
            node = c * max_links + (k - a)
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
        return True

    def finish(c: int) -> None:
        """FluidNetwork._finish: channel c's flow leaves its links."""
        now = tnow[0]
        op = cur_op(c)
        s = shape(op)
        a, b = sh_ptr[s], sh_ptr[s + 1]
        ceiling = fl_ceil[c]
        for k in range(a, b):
            lid, w = sh_lid[k], sh_w[k]
            node = c * max_links + (k - a)
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

    def freeze(f: int, level: float, stamp: int, by_heap: bool) -> int:
        """Fix flow f's rate at `level`; its weight leaves every link of the problem. Returns
        how many one-flow links it emptied (fill_heap's count of those still open)."""
        fl_rated[f] = stamp
        fl_new[f] = level
        s = shape(cur_op(f))
        emptied = 0
        for k in range(sh_ptr[s], sh_ptr[s + 1]):
            l2 = sh_lid[k]
            if incomp[l2] == stamp:
                if by_heap:
                    left[l2] -= (level - at[l2]) * ws[l2]
                    at[l2] = level
                was = ws[l2]
                ws[l2] = was - sh_w[k]
                if active[l2] == 1 and was > TINY_WEIGHT and ws[l2] <= TINY_WEIGHT:
                    emptied += 1
        return emptied

    def freeze_link(lid: int, level: float, stamp: int, by_heap: bool) -> int:
        """Freeze lid's flows not yet frozen; returns the one-flow links they emptied."""
        emptied = 0
        node = head[lid]
        while node >= 0:
            f = node // max_links
            if fl_rated[f] != stamp:
                emptied += freeze(f, level, stamp, by_heap)
            node = node_next[node]
        return emptied

    def fill_scan(nl: int, stamp: int) -> None:
        """fluid._fill_by_scan: each level, the smallest fill level over every open link."""
        na = 0
        for j in range(nl):
            lid = comp_links[j]
            rem[lid] = cap[lid]
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
                if rem[lid] <= SATURATED_RTOL * cap[lid]:
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
            return False, _hpop(fk, fs, fp, fv, n)
        cur = at[lid] + max(left[lid], 0.0) / w
        if cur > fk[0]:
            _hsift(fk, fs, fp, fv, n, cur, lid, 0, 0)
            return False, n
        return True, n

    def bring_in(nout: int, n: int) -> int:
        """Push the one-flow links fill_heap left out (the first `nout` of `act`) that are
        still open, at the keys they would have had from the start (their capacity over the
        link's weight); returns the heap's size."""
        for j in range(nout):
            lid = act[j]
            if ws[lid] > TINY_WEIGHT:
                n = _hpush(fk, fs, fp, fv, n, cap[lid] / weight[lid], lid, 0, 0)
        return n

    def fill_heap(nl: int, stamp: int) -> None:
        """fluid._fill_by_heap: links wait in a heap by the level at which they fill.

        Links of one flow (most of a skewed dispatch's problem: each flow's own NIC and PCIe
        hops) wait outside the heap: pushing and popping them was most of the filling, and such
        a link matters only if its flow is still unfrozen when the filling reaches its level.
        While the heap's top stays below the lowest of them, it is the top the full heap would
        have (an emptied one is dropped unseen either way, and joins no level's batch), so the
        filling pops what it would pop with them in; when the top reaches that level, or the
        heap empties, with one still open, the open ones come in at the keys they would have
        had. Keys and lids cannot tie, so the order entries come off is the same however the
        heap was built (heapified, not pushed one by one)."""
        n = 0
        lowest = np.inf          # the lowest level of a one-flow link left out
        outside = 0              # of those, the ones whose flow is not frozen yet
        for j in range(nl):
            lid = comp_links[j]
            left[lid] = cap[lid]
            at[lid] = 0.0
            if ws[lid] > TINY_WEIGHT:
                key = cap[lid] / ws[lid]
                if active[lid] == 1:
                    act[outside] = lid          # act: fill_scan's scratch, free here
                    outside += 1
                    if key < lowest:
                        lowest = key
                else:
                    fk[n], fs[n] = key, lid
                    n += 1
        for i in range(n // 2 - 1, -1, -1):
            _hdown(fk, fs, fp, fv, n, i)
        nout = outside
        while True:
            if outside > 0 and (n == 0 or fk[0] >= lowest):
                n = bring_in(nout, n)
                outside = 0
            if n == 0:
                break
            ok, n = top_is_current(n)
            if not ok:
                continue
            level = fk[0]
            full[0] = fs[0]
            nfull = 1
            n = _hpop(fk, fs, fp, fv, n)
            while True:                             # links full at this level too
                if outside > 0 and (n == 0 or fk[0] >= lowest):
                    n = bring_in(nout, n)
                    outside = 0
                if n == 0:
                    break
                ok, n = top_is_current(n)
                if not ok:
                    continue
                l2 = fs[0]
                if (fk[0] - level) * ws[l2] > SATURATED_RTOL * cap[l2]:
                    break
                full[nfull] = l2
                nfull += 1
                n = _hpop(fk, fs, fp, fv, n)
            for j in range(nfull):
                b = full[j]
                outside -= freeze_link(b, level, stamp, True)
                ws[b] = 0.0

    def settle() -> None:
        """FluidNetwork.settle: re-solve the component this instant's changes reach."""
        nd = st[NDIRTY]
        if nd == 0:
            return
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
                    s = shape(cur_op(f))
                    for k in range(sh_ptr[s], sh_ptr[s + 1]):
                        l2 = sh_lid[k]
                        if seen[l2] != stamp and demand[l2] > slack_below[l2]:
                            seen[l2] = stamp
                            lstack[top] = l2
                            top += 1
                node = node_next[node]
        if nf == 0:
            return
        now = tnow[0]
        for j in range(nf):
            f = comp_flows[j]
            fl_rem[f] -= fl_rate[f] * (now - fl_tref[f])
            fl_tref[f] = now
        for j in range(nl):
            lid = comp_links[j]
            ws[lid] = weight[lid]
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
            rate = (fl_new[f] if fl_rated[f] == stamp else level) * rate_scale
            old = fl_rate[f]
            if old > 0 and abs(rate - old) <= RATE_RTOL * old:
                continue                 # same rate: its pending wake-up is still right
            fl_rate[f] = rate
            fl_ver[f] += 1
            if rate > 0:
                push_event(now + max(fl_rem[f], 0.0) / rate, FINISH, f, fl_ver[f])

    if st[INIT] == 0:
        st[INIT] = 1
        for c in range(n_ch - 1, -1, -1):      # popped from the end: rank, channel order
            ready[st[NREADY]] = c
            st[NREADY] += 1
        drain()
    bp, bv = np.empty(len(hk), np.int64), np.empty(len(hk), np.int64)   # one round's events
    while st[HSIZE] > 0:
        if st[INSTANTS] >= stop_instants:
            return PAUSED
        if st[HSIZE] + 2 * n_ch + 2 > len(hk):
            return GROW
        t = hk[0]
        tnow[0] = t
        end = t + INSTANT_RTOL * max(t, 1.0)     # fluid.instant_end
        while st[HSIZE] > 0 and hk[0] <= end:
            n = 0                                # a round: what is pending, then in (channel,
            while st[HSIZE] > 0 and hk[0] <= end:    # begin before end) order, stably
                bp[n], bv[n] = hp[0], hv[0]
                n += 1
                st[HSIZE] = _hpop(hk, hs, hp, hv, st[HSIZE])
            _sort_round(bp, bv, n)
            for j in range(n):
                p, v = bp[j], bv[j]
                c = p >> 1
                if p & 1 == BEGIN:
                    if not transfer(c):
                        finished(c)            # nothing to move: ends at once
                elif fl_ver[c] == v:
                    finish(c)
        settle()
        st[INSTANTS] += 1
    return DONE
