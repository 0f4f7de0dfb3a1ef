"""Fluid flows sharing links max-min fairly, on the simulator's own event clock.

A transfer is a flow that uses several links at once, each with a weight (bytes on that link
per byte moved: a reduce reads HBM once per local source). Rates are recomputed by progressive
filling once per simulated instant however many flows started or ended in it (a ring step
starts thousands at the same time), and only for the flows a change can reach.

What a change can reach: a link that cannot fill — the flows on it could not use all of it even
each at its best rate alone (`Flow.ceiling`: its tightest link) — never limits anyone, so
progressive filling never picks it and it can be left out of the problem without changing a
single rate. The flows then fall apart into components joined only by links that can fill: an
HBM that a ring's flows all touch (in at one rank, out at the next) no longer makes the whole
ring one problem, so a flow's end re-solves its neighbours, not every flow.

The clock is a heap of (time, tie, what); `EventClock.run` hands each instant's events to their
callbacks and then lets the network settle that instant's changes. An instant is every event
within INSTANT_RTOL (relative) of its first, handled at that first one's time, in the order of
keys their owners give (the engine: channel, then begin before end), not in the order their
times or their scheduling happened to fall: flows that end 1e-12 us apart (rounding apart) end
together, and a change of rounding's size reorders nothing. Every collection the rates are
computed from is walked in insertion order (dicts, not sets of flows, whose order is their
addresses'), the order the compiled core walks its lists in: both engines do the same
arithmetic in the same order.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from hiercoll.sim.config import EPS_BYTES, RATE_RTOL, SATURATED_RTOL

# a link whose flows' summed best rates stay below this share of its capacity cannot fill; far
# above float noise in the running sums (they gain and lose terms as flows come and go)
SLACK_MARGIN = 1e-6
# events within this of an instant's first (relative, and absolute in us below 1 us) are that
# instant: far above the rounding of a time (1e-16) or of the bytes left (a few ulps), far below
# anything a schedule or a topology sets apart
INSTANT_RTOL = 1e-9
# an event's tie is its key above this many bits of scheduling order: an instant's events run by
# key; events of one key, in the order they were scheduled
TIE_BITS = 40
# a quiet instant (FluidNetwork.settle) needs every link its changes touch, other than a started
# flow's own, this far below its capacity: far above the drift of the running sums of rates on
# a link (`used`), far above SATURATED_RTOL, at which the filling calls a link full
QUIET_MARGIN = 1e-6
# a local re-solve (FluidNetwork._local) that grows more often than this gives way to the
# whole component's
LOCAL_ROUNDS = 8
# Quiet instants and local re-solves are opt-in: HIERCOLL_SIM_LOCAL=1. They settle only the flows
# whose rate moves, which changes rounding (the 1024-rank Zipf MoE dispatch: 24074.6 us with whole
# re-solves, 24075.5 with local ones; both engines alike), and a stale wake-up opens no instant.
# The local set grows along the rates that change (issue 29, 2026-11-28; it first grew through
# every near-full link, which on an oversubscribed tier is all of them): the 4096-GPU ECMP hier
# replays whole (35.6M ops, 33M instants, 7.2M local re-solves of ~8 flows, 3 whole ones) in
# ~100-140 CPU s where the first local path had done 29.8M ops in 130 s and whole re-solves 9.5M;
# 1024 GPUs in two 7:1 pods of 64 nodes: killed at 200 s half done -> 4 s. Off, both engines
# re-solve and settle a whole component as every committed result was made.
LOCAL_ENV = "HIERCOLL_SIM_LOCAL"


def local_resolve() -> bool:
    """Whether quiet instants are skipped and changes re-solved locally ($HIERCOLL_SIM_LOCAL)."""
    return os.environ.get(LOCAL_ENV, "") == "1"


def instant_end(t: float) -> float:
    """The latest time an event joins the instant that opens at `t` (the compiled core
    computes the same expression)."""
    return t + INSTANT_RTOL * max(t, 1.0)


@dataclass(eq=False, slots=True)
class Flow:
    links: tuple[tuple[int, float], ...]   # (link id, weight)
    remaining: float                      # bytes left at time `t_ref`
    token: object = None                  # handed back to the network's owner when it ends
    rate: float = 0.0                     # bytes per microsecond
    t_ref: float = 0.0
    version: int = 0
    ceiling: float = 0.0                  # its rate alone: min over links of capacity / weight
    key: int = 0                          # its end's key among an instant's events


@dataclass
class LinkUsage:
    """Per-link totals the result reports (bytes moved, time with any traffic)."""

    bytes: list[float]
    busy_us: list[float]
    active: list[int]
    busy_since: list[float]
    record: list[list[tuple[float, float]]] | None  # (time, utilisation) steps when tracing


class EventClock:
    """Time and a heap of (time, tie, callback, argument), the tie being the event's key (its
    owner's: see the module's docstring) over its scheduling order. An instant takes every event
    up to `instant_end` of the first, runs them at the first one's time in tie order (in rounds:
    what they schedule within the instant runs after them, in tie order again), and then runs
    `settle` (the network's rate update), which may schedule more for later instants."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        # an event this says is void (a wake-up whose flow's rate changed since) opens no
        # instant: it is dropped when it comes to the top (set with the local re-solve)
        self.void: Callable[[Callable[[Any], None], Any], bool] | None = None

    def at(self, time: float, fn: Callable[[Any], None], arg: Any, key: int = 0) -> None:
        """Schedule fn(arg) at `time`; `key` (>= 0) orders it among its instant's events."""
        self._seq += 1
        heapq.heappush(self._heap, (time, (key << TIE_BITS) | self._seq, fn, arg))

    def run(self, settle: Callable[[], None], tick: Callable[[], None] | None = None) -> None:
        """Every instant in time order; `tick` (progress) after every 1024th."""
        heap, pop, tie, void = self._heap, heapq.heappop, itemgetter(1), self.void
        instants = 0
        while heap:
            if void is not None and void(heap[0][2], heap[0][3]):
                pop(heap)
                continue
            t = heap[0][0]
            self.now = t
            end = instant_end(t)
            while heap and heap[0][0] <= end:
                batch = [pop(heap)]
                while heap and heap[0][0] <= end:
                    batch.append(pop(heap))
                if len(batch) > 1:
                    batch.sort(key=tie)
                for _, _, fn, arg in batch:
                    fn(arg)
            settle()
            instants += 1
            if tick is not None and not instants & 1023:
                tick()


class FluidNetwork:
    """Flows on links. `transfer` starts one; when it ends, `on_done(token)` runs (at the
    instant it ends, before that instant's rates are settled)."""

    def __init__(self, clock: EventClock, capacities: list[float], on_done: Callable[[Any], None],
                 record: bool = False, crowded: dict[int, float] | None = None):
        self.clock = clock
        self.cap = list(capacities)          # as of now: crowded links change theirs
        # links whose capacity drops to crowded[lid] while two or more flows use them; a flow's
        # ceiling takes the capacity alone (the higher), so demand never understates what a
        # link could be asked for and the slack test stays safe
        self.alone = capacities
        self.crowded = crowded or {}
        self.record = record
        self.on_done = on_done
        n = len(capacities)
        # each link's flows, in the order they started (a dict: a set's order is the flows'
        # addresses', which would make rounding differ from run to run)
        self.flows_on: list[dict[Flow, None]] = [{} for _ in range(n)]
        # summed weight x ceiling of the flows on each link, and the share below which it is slack
        # (tracing records every link's utilisation, so nothing is left out then)
        self.demand = [0.0] * n
        self.weight = [0.0] * n      # summed weight of the flows on each link (max_min_rates)
        self.slack_below = [c * (1.0 - SLACK_MARGIN) if not record else -1.0 for c in capacities]
        self.usage = LinkUsage([0.0] * n, [0.0] * n, [0] * n, [0.0] * n,
                               [[] for _ in range(n)] if record else None)
        self._dirty: dict[int, None] = {}     # links changed this instant, in that order
        # summed weight x rate of the flows on each link, as of their last rates (a quiet
        # instant's test); flows started this instant, in that order; whether this instant's
        # changes may move a rate (a flow ended on a link near full, a capacity changed)
        self.used = [0.0] * n
        self._started: list[Flow] = []
        self._loud = record
        self._seeds: dict[int, None] = {}     # links near full an ended flow left, or re-capped
        self.local = local_resolve()
        if self.local:
            clock.void = self._void

    def transfer(self, links: tuple[tuple[int, float], ...], nbytes: float, token: object,
                 key: int = 0) -> bool:
        """Start a flow; False when there is nothing to move (it ended at once, no callback).
        `key`: its end's key among the events of the instant it ends in (EventClock.at)."""
        if nbytes <= EPS_BYTES or not links:
            return False
        now, cap = self.clock.now, self.alone
        ceiling = float("inf")
        for lid, w in links:
            c = cap[lid] / w
            if c < ceiling:
                ceiling = c
        flow = Flow(links, float(nbytes), token, t_ref=now, ceiling=ceiling, key=key)
        usage, demand, weight = self.usage, self.demand, self.weight
        for lid, w in links:
            self.flows_on[lid][flow] = None
            weight[lid] += w
            if lid in self.crowded and len(self.flows_on[lid]) == 2:
                self._set_capacity(lid, self.crowded[lid])
            usage.bytes[lid] += w * nbytes
            if usage.active[lid] == 0:
                usage.busy_since[lid] = now
            usage.active[lid] += 1
            demand[lid] += w * ceiling
            self._dirty[lid] = None
        self._started.append(flow)
        return True

    def _set_capacity(self, lid: int, capacity: float) -> None:
        """A crowded link's capacity as its flow count crosses two (the caller marks it dirty)."""
        self.cap[lid] = capacity
        self._loud = True
        self._seeds[lid] = None
        if not self.record:
            self.slack_below[lid] = capacity * (1.0 - SLACK_MARGIN)

    # ---- rate computation --------------------------------------------------------------------
    def _component(self) -> tuple[dict[Flow, None], list[int]]:
        """Flows a change can reach and the links that can fill among theirs: every flow on a
        changed link, then through links that can fill only (both in the order found)."""
        flows: dict[Flow, None] = {}
        links: list[int] = []
        seen: set[int] = set()
        demand, slack_below, flows_on = self.demand, self.slack_below, self.flows_on
        stack = list(self._dirty)
        self._dirty.clear()
        seen.update(stack)
        while stack:
            lid = stack.pop()
            if demand[lid] > slack_below[lid]:
                links.append(lid)
            for f in flows_on[lid]:
                if f not in flows:
                    flows[f] = None
                    for l2, _ in f.links:
                        if l2 not in seen and demand[l2] > slack_below[l2]:
                            seen.add(l2)
                            stack.append(l2)
        return flows, links

    def settle(self) -> None:
        """Re-solve the rates a change of this instant can reach; reschedule the flows whose
        rate moved (the others' pending end stays right). A quiet instant is not re-solved."""
        if not self._dirty:
            return
        started, self._started = self._started, []
        loud, self._loud = self._loud, self.record
        seeds, self._seeds = self._seeds, {}
        if self.local and not loud and self._quiet(started):
            self._dirty.clear()
            return
        if self.local and not self.record and self._local(started, seeds):
            self._dirty.clear()
            return
        flows, links = self._component()
        if not flows:
            return
        now = self.clock.now
        for f in flows:                      # settle bytes moved at the old rate
            f.remaining -= f.rate * (now - f.t_ref)
            f.t_ref = now
        rates = max_min_rates(flows, links, self.cap, self.weight, self.flows_on)
        for f in flows:
            rate = rates[f]
            if f.rate > 0 and abs(rate - f.rate) <= RATE_RTOL * f.rate:
                continue                     # same rate: its pending wake-up is still right
            self._set_rate(f, rate, now)
        if self.usage.record is not None:
            for lid in links:
                used = sum(f.rate * w for f in self.flows_on[lid] for l, w in f.links if l == lid)
                self.usage.record[lid].append((now, used / self.cap[lid]))

    def _set_rate(self, f: Flow, rate: float, now: float) -> None:
        """A new rate for f (its bytes settled up to now): its links' `used`, its wake-up."""
        used, old = self.used, f.rate
        for lid, w in f.links:
            used[lid] += w * (rate - old)
        f.rate = rate
        f.version += 1
        if rate > 0:
            self.clock.at(now + max(f.remaining, 0.0) / rate, self._finish, (f, f.version), f.key)

    def _quiet(self, started: list[Flow]) -> bool:
        """Whether this instant's changes provably move no rate but the started flows' own
        (the caller has checked that no flow ended on a link within QUIET_MARGIN of full and
        no capacity changed): then each started flow runs at its rate alone (`ceiling`), which
        every link of it with other flows on it has room for, together with the other started
        flows on it, with QUIET_MARGIN to spare. Every old flow keeps the bottleneck it had (a
        full link: no started flow is on it, no ended flow was), each started flow has its own
        (its tightest link, which holds it alone), and the rates fit every link: the max-min
        fair allocation, unchanged for every other flow, so no other flow is re-solved or
        settled. The rates are set in start order, each by `max_min_rates` over its tightest
        link alone (the compiled core: its ceiling x rate_scale)."""
        cap, used, flows_on = self.cap, self.used, self.flows_on
        extra: dict[int, float] = {}
        for f in started:
            for lid, w in f.links:
                if len(flows_on[lid]) > 1:
                    x = extra.get(lid, 0.0) + w * f.ceiling
                    if used[lid] + x > cap[lid] * (1.0 - QUIET_MARGIN):
                        return False
                    extra[lid] = x
        now = self.clock.now
        for f in started:
            tight = next(lid for lid, w in f.links if cap[lid] / w == f.ceiling)
            self._set_rate(f, max_min_rates((f,), (tight,), cap)[f], now)
        return True

    def _local(self, started: list[Flow], seeds: dict[int, None]) -> bool:
        """Re-solve only the flows whose rates can move; False: it grew past LOCAL_ROUNDS
        (the caller re-solves the whole component).

        The set starts as the started flows, every flow on a near-full link of a started flow
        (it will share it: taken now, not a round later) and every flow on a seed link (near full
        as an ended flow left it, or re-capped). Its problem is every link one of its flows could fill:
        a link whose flows are all in the set with its capacity (closed), one shared with flows
        outside with what they leave of it at their rates (mixed: `cap - (used - the set's
        share)`), only the set's flows on it. After filling, a mixed link takes its flows into the
        set (and the set is filled again) where the outside flows' rates may no longer be max-min:
        it was near full (an outside flow may have its bottleneck there) and a flow of the set on
        it changed its rate (or started); or a flow of the set froze on it (its bottleneck) below
        an outside flow's rate. Otherwise every outside flow keeps its bottleneck (untouched, or
        near full with the set's rates on it as they were), every flow of the set has one (the
        link it froze on, full, its rate the highest there) and every link holds its rates: the
        max-min fair allocation (to the tolerances of the tests: RATE_RTOL on rates, rounding
        on the residual capacities). Only the set's flows are settled. The set grows along the
        rates that change, not along every near-full link (an oversubscribed tier is all near
        full). A link's members in the problem are the set's flows in the set's order (closed
        links too), so the freezing order, and the rounding, is the compiled core's: it walks
        the same sets in the same order."""
        cap, used, flows_on, demand, slack_below, weight = (self.cap, self.used, self.flows_on,
                                                            self.demand, self.slack_below, self.weight)
        flows: dict[Flow, None] = dict.fromkeys(started)
        seen: set[int] = set()
        stack: list[int] = []

        def push(lid: int) -> None:
            if lid not in seen:
                seen.add(lid)
                stack.append(lid)

        margin = 1.0 - QUIET_MARGIN
        for f in started:                     # a started flow shares its near-full links
            for lid, _ in f.links:
                if used[lid] > cap[lid] * margin:
                    push(lid)
        for lid in seeds:
            push(lid)
        for _ in range(LOCAL_ROUNDS):
            while stack:
                for f in flows_on[stack.pop()]:
                    if f not in flows:
                        flows[f] = None
            # fillable links of the set, in the order found: the set's flows on them (in the
            # set's order), their summed weight and weight x rate
            members: dict[int, list[Flow]] = {}
            share: dict[int, float] = {}
            old: dict[int, float] = {}
            for f in flows:
                for lid, w in f.links:
                    if demand[lid] > slack_below[lid]:
                        if lid in members:
                            members[lid].append(f)
                            share[lid] += w
                            old[lid] += w * f.rate
                        else:
                            members[lid], share[lid], old[lid] = [f], w, w * f.rate
            pcap: dict[int, float] = {}
            mixed: list[int] = []
            for lid, on in members.items():
                if len(on) == len(flows_on[lid]):
                    pcap[lid], share[lid] = cap[lid], weight[lid]
                else:
                    pcap[lid] = max(cap[lid] - (used[lid] - old[lid]), 0.0)
                    mixed.append(lid)
            bots: dict[Flow, int] = {}
            rates = max_min_rates(flows, list(members), pcap, share, members, bots)
            if len(bots) < len(flows):
                return False                  # a flow bound by no link of the problem
            for lid in mixed:
                near = used[lid] > cap[lid] * margin
                moved = False
                froze = -1.0
                for f in members[lid]:
                    r = rates[f]
                    if f.rate <= 0 or abs(r - f.rate) > RATE_RTOL * f.rate:
                        moved = True
                    if bots[f] == lid and r > froze:
                        froze = r
                if near and moved:
                    push(lid)
                elif froze >= 0:
                    bound = froze * (1.0 + RATE_RTOL)
                    for f in flows_on[lid]:
                        if f not in flows and f.rate > bound:
                            push(lid)
                            break
            if stack:
                continue
            now = self.clock.now
            for f in flows:                      # settle bytes moved at the old rate
                f.remaining -= f.rate * (now - f.t_ref)
                f.t_ref = now
            for f in flows:
                rate = rates[f]
                if f.rate > 0 and abs(rate - f.rate) <= RATE_RTOL * f.rate:
                    continue
                self._set_rate(f, rate, now)
            return True
        return False

    def _void(self, fn: Callable[[Any], None], arg: Any) -> bool:
        """Whether an event is a stale wake-up (its flow's rate changed since it was set): with
        the local re-solve it opens no instant, so it cannot pull a later event (within
        INSTANT_RTOL) back to its own time; every instant opens at a live event."""
        return getattr(fn, "__func__", None) is FluidNetwork._finish and arg[0].version != arg[1]

    def _finish(self, arg: tuple[Flow, int]) -> None:
        flow, version = arg
        if flow.version != version:
            return                            # its rate changed since this wake-up was set
        now = self.clock.now
        usage, demand, weight, used, cap = self.usage, self.demand, self.weight, self.used, self.cap
        for lid, w in flow.links:
            on = self.flows_on[lid]
            if len(on) > 1 and used[lid] > cap[lid] * (1.0 - QUIET_MARGIN):
                self._loud = True                 # others may take what it leaves
                self._seeds[lid] = None
            del on[flow]
            used[lid] = used[lid] - w * flow.rate if on else 0.0
            weight[lid] = weight[lid] - w if on else 0.0
            if lid in self.crowded and len(on) == 1:
                self._set_capacity(lid, self.alone[lid])
            usage.active[lid] -= 1
            if usage.active[lid] == 0:
                usage.busy_us[lid] += now - usage.busy_since[lid]
                if usage.record is not None:
                    usage.record[lid].append((now, 0.0))
            demand[lid] = demand[lid] - w * flow.ceiling if on else 0.0   # no drift when idle
            self._dirty[lid] = None
        flow.rate, flow.remaining = 0.0, 0.0
        self.on_done(flow.token)


Capacities = Sequence[float] | Mapping[int, float]     # per link id: a list, or a dict of some

# progressive filling scans every open link per level while a problem is this small, and keeps
# the links in a heap by fill level above it (ECMP spines: thousands of links, tens of levels)
HEAP_ABOVE_LINKS = 64


def max_min_rates(flows: Collection[Flow], links: Collection[int], cap: Capacities,
                  weights: Capacities | None = None,
                  on: Sequence[Collection[Flow]] | Mapping[int, Collection[Flow]] | None = None,
                  bots: dict[Flow, int] | None = None) -> dict[Flow, float]:
    """Weighted progressive filling: raise every unfrozen flow's rate together; when a link
    fills, freeze its flows at the current level. Unique max-min fair allocation. Links of a
    flow that are not in `links` do not constrain it (the caller leaves out links that cannot
    fill; every flow has at least one that can: its tightest).

    Links are filled in the order `links` gives them and a link's flows frozen in the order
    `on` (or `flows`) gives them: the network passes both in the order the compiled core walks
    them, so the two round alike.

    Hot (called at every instant that starts or ends flows): plain dicts and lists. A small
    problem scans its open links per level; a large one (a 4096-GPU step whose flows all cross
    an oversubscribed aggregation tier: ~1300 links, ~10 levels, at every flow's end) keeps
    them in a heap, so a level costs the links its frozen flows touch, not every open link.

    `weights` / `on`: every link's summed flow weight and its flows, where the caller keeps
    them (then every flow on a link of `links` must be in `flows`); else counted here. `cap`,
    `weights` and `on` are indexed by link id (lists, or dicts of the links of `links`).
    `bots`, where given, gets the link each flow froze on (none: the flow was bound by no link
    of `links` and took the highest level)."""
    members: Mapping[int, Collection[Flow]]
    if weights is not None and on is not None:
        weight_sum = {lid: weights[lid] for lid in links}
        members = {lid: on[lid] for lid in links}
    else:
        weight_sum = dict.fromkeys(links, 0.0)
        counted: dict[int, list[Flow]] = {lid: [] for lid in links}
        for f in flows:
            for lid, w in f.links:
                if lid in weight_sum:
                    weight_sum[lid] += w
                    counted[lid].append(f)
        members = counted
    fill = _fill_by_heap if len(links) > HEAP_ABOVE_LINKS else _fill_by_scan
    rates = fill(members, weight_sum, cap) if bots is None else fill(members, weight_sum, cap, bots)
    level = max(rates.values(), default=0.0)
    for f in flows:
        if f not in rates:
            rates[f] = level
    return rates


def _fill_by_scan(members: Mapping[int, Collection[Flow]], weight_sum: dict[int, float],
                  cap: Capacities, bots: dict[Flow, int] | None = None) -> dict[Flow, float]:
    """Each level: the smallest fill level over every open link."""
    remaining = {lid: cap[lid] for lid in weight_sum}
    rates: dict[Flow, float] = {}
    active = [lid for lid in weight_sum if weight_sum[lid] > 1e-12]
    level = 0.0
    while active:
        best = min(remaining[lid] / weight_sum[lid] for lid in active)
        level += best
        bottlenecks = []
        for lid in active:
            remaining[lid] -= best * weight_sum[lid]
            if remaining[lid] <= SATURATED_RTOL * cap[lid]:
                bottlenecks.append(lid)
        if not bottlenecks:     # rounding: the minimum link is the bottleneck
            bottlenecks = [min(active, key=lambda l: remaining[l] / weight_sum[l])]
        for lid in bottlenecks:
            for f in members[lid]:
                if f not in rates:
                    rates[f] = level
                    if bots is not None:
                        bots[f] = lid
                    for l2, w in f.links:
                        if l2 in weight_sum:
                            weight_sum[l2] -= w
        done = set(bottlenecks)
        active = [lid for lid in active if weight_sum[lid] > 1e-12 and lid not in done]
    return rates


def _fill_by_heap(members: Mapping[int, Collection[Flow]], weight_sum: dict[int, float],
                  cap: Capacities, bots: dict[Flow, int] | None = None) -> dict[Flow, float]:
    """Links wait in a heap by the level at which they fill. A frozen flow leaving a link only
    raises that level, so an entry is a lower bound of its link's: it is brought up to date
    when it reaches the top (pushed again if it rose), not on every change. Links full within
    SATURATED_RTOL of the popped level are bottlenecks of the same level, as in the scan."""
    left = {lid: cap[lid] for lid in weight_sum}     # capacity not yet taken, as of level at[lid]
    at = dict.fromkeys(weight_sum, 0.0)
    heap = [(cap[lid] / ws, lid) for lid, ws in weight_sum.items() if ws > 1e-12]
    heapq.heapify(heap)
    pop, replace = heapq.heappop, heapq.heapreplace
    rates: dict[Flow, float] = {}

    def top_is_current() -> bool:
        """Whether the top entry holds its link's fill level now (else it is dropped or
        re-queued at that level)."""
        t, lid = heap[0]
        ws = weight_sum[lid]
        if ws <= 1e-12:
            pop(heap)
            return False
        now = at[lid] + max(left[lid], 0.0) / ws
        if now > t:
            replace(heap, (now, lid))
            return False
        return True

    while heap:
        if not top_is_current():
            continue
        level, first = pop(heap)
        full = [first]
        while heap:                            # links full at this level too
            if not top_is_current():
                continue
            t2, l2 = heap[0]
            if (t2 - level) * weight_sum[l2] > SATURATED_RTOL * cap[l2]:
                break
            full.append(pop(heap)[1])
        for b in full:
            for f in members[b]:
                if f in rates:
                    continue
                rates[f] = level
                if bots is not None:
                    bots[f] = b
                for l2, w in f.links:
                    ws = weight_sum.get(l2)
                    if ws is None:
                        continue
                    left[l2] -= (level - at[l2]) * ws
                    at[l2] = level
                    weight_sum[l2] = ws - w
            weight_sum[b] = 0.0
    return rates
