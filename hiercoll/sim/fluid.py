"""Fluid flows sharing links max-min fairly, driven by a simpy Environment.

A transfer is a flow that uses several links at once, each with a weight (bytes on that link
per byte moved: a reduce reads HBM once per local source). Rates are recomputed by progressive
filling whenever flows start or end — but only for the connected component of links the change
touches, and once per simulated instant however many flows changed in it (a ring step starts
thousands of flows at the same time).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import simpy

from hiercoll.sim.config import EPS_BYTES, RATE_RTOL, SATURATED_RTOL


@dataclass(eq=False, slots=True)
class Flow:
    links: tuple[tuple[int, float], ...]   # (link id, weight)
    remaining: float                      # bytes left at time `t_ref`
    done: simpy.Event
    rate: float = 0.0                     # bytes per microsecond
    t_ref: float = 0.0
    version: int = 0
    ids: tuple[int, ...] = ()             # link ids alone (the component search walks them)


@dataclass
class LinkUsage:
    """Per-link totals the result reports (bytes moved, time with any traffic)."""

    bytes: list[float]
    busy_us: list[float]
    active: list[int]
    busy_since: list[float]
    record: list[list[tuple[float, float]]] | None  # (time, utilisation) steps when tracing


class FluidNetwork:
    def __init__(self, env: simpy.Environment, capacities: list[float], record: bool = False):
        self.env = env
        self.cap = capacities
        n = len(capacities)
        self.flows_on: list[set[Flow]] = [set() for _ in range(n)]
        self.usage = LinkUsage([0.0] * n, [0.0] * n, [0] * n, [0.0] * n,
                               [[] for _ in range(n)] if record else None)
        self._dirty: set[int] = set()
        self._pending = False

    def transfer(self, links: tuple[tuple[int, float], ...], nbytes: float) -> simpy.Event:
        done = self.env.event()
        if nbytes <= EPS_BYTES or not links:
            done.succeed()
            return done
        flow = Flow(links, float(nbytes), done, t_ref=self.env.now, ids=tuple(l for l, _ in links))
        now = self.env.now
        for lid, w in links:
            self.flows_on[lid].add(flow)
            self.usage.bytes[lid] += w * nbytes
            if self.usage.active[lid] == 0:
                self.usage.busy_since[lid] = now
            self.usage.active[lid] += 1
            self._dirty.add(lid)
        self._schedule_recompute()
        return done

    # ---- rate computation --------------------------------------------------------------------
    def _schedule_recompute(self) -> None:
        if not self._pending:
            self._pending = True
            ev = self.env.timeout(0)
            ev.callbacks.append(self._recompute)

    def _component(self) -> tuple[set[Flow], set[int]]:
        flows: set[Flow] = set()
        links: set[int] = set()
        stack = list(self._dirty)
        self._dirty.clear()
        while stack:
            lid = stack.pop()
            if lid in links:
                continue
            links.add(lid)
            for f in self.flows_on[lid]:
                if f not in flows:
                    flows.add(f)
                    stack.extend(f.ids)
        return flows, links

    def _recompute(self, _event: object = None) -> None:
        self._pending = False
        flows, links = self._component()
        if not flows:
            return
        now = self.env.now
        for f in flows:                      # settle bytes moved at the old rate
            f.remaining -= f.rate * (now - f.t_ref)
            f.t_ref = now
        rates = max_min_rates(flows, links, self.cap)
        for f in flows:
            rate = rates[f]
            if f.rate > 0 and abs(rate - f.rate) <= RATE_RTOL * f.rate:
                continue                     # same rate: its pending wake-up is still right
            f.rate = rate
            f.version += 1
            delay = max(f.remaining, 0.0) / f.rate if f.rate > 0 else float("inf")
            ev = self.env.timeout(delay)
            ev.callbacks.append(partial(self._finish, f, f.version))
        if self.usage.record is not None:
            for lid in links:
                used = sum(f.rate * w for f in self.flows_on[lid] for l, w in f.links if l == lid)
                self.usage.record[lid].append((now, used / self.cap[lid]))

    def _finish(self, flow: Flow, version: int, _wake_up: simpy.Event) -> None:
        if flow.version != version:
            return                            # its rate changed since this wake-up was set
        now = self.env.now
        for lid, _ in flow.links:
            self.flows_on[lid].discard(flow)
            self.usage.active[lid] -= 1
            if self.usage.active[lid] == 0:
                self.usage.busy_us[lid] += now - self.usage.busy_since[lid]
                if self.usage.record is not None:
                    self.usage.record[lid].append((now, 0.0))
            self._dirty.add(lid)
        flow.rate, flow.remaining = 0.0, 0.0
        flow.done.succeed()
        self._schedule_recompute()


def max_min_rates(flows: set[Flow], links: set[int], cap: list[float]) -> dict[Flow, float]:
    """Weighted progressive filling: raise every unfrozen flow's rate together; when a link
    fills, freeze its flows at the current level. Unique max-min fair allocation.

    Hot (called at every flow start/end): plain dicts and lists, only links that still carry
    unfrozen flows are scanned."""
    remaining = {lid: cap[lid] for lid in links}
    weight_sum = dict.fromkeys(links, 0.0)
    members: dict[int, list[Flow]] = {lid: [] for lid in links}
    for f in flows:
        for lid, w in f.links:
            weight_sum[lid] += w
            members[lid].append(f)
    rates: dict[Flow, float] = {}
    active = [lid for lid in links if weight_sum[lid] > 1e-12]
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
                    for l2, w in f.links:
                        weight_sum[l2] -= w
        active = [lid for lid in active if weight_sum[lid] > 1e-12 and lid not in bottlenecks]
    for f in flows:
        if f not in rates:
            rates[f] = level
    return rates
