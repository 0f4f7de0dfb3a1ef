"""The fused all-reduce + residual add + RMSNorm protocol on a weak memory model, in numpy (CPU).

Why: one GPU shares one L2, so dropping a release or an acquire from the kernel does not make the
one-GPU stress fail (bench/results/fused_norm/negatives.log); the ordering has to be checked by a
model that allows what the PTX/HIP memory models allow. This one walks the kernel's protocol
(the same `fused_norm_abi` rows, slots, parities and buffer regions) with every rank's CTAs as
coroutines under a seeded random scheduler, each CTA made of a few threads (lanes), and memory:
- a plain store goes into its thread's pending list; pending stores become visible (get a time in
  the location's history) only at a release by the thread's CTA (after its CTA barrier: the
  barrier makes every lane's stores the releasing thread's) or at the end of the kernel — a
  legal, adversarial execution;
- an atomic (the signal slots) is coherent: it reads and writes the newest value at once;
- a thread's plain load of a peer-visible location returns the newest value whose time is at most
  the thread's *floor*, the time of the latest release it synchronised with through an acquire of
  its own (0 at kernel start: without an acquire nothing written by a peer is promised). A CTA
  barrier moves no floor: the polling thread's acquire orders only the polling thread.
So a missing release lets a peer read data still pending; a missing acquire, or one done only by
the polling thread, reads old data (the previous use of the double buffer, or the initial NaN).
The LL form (stage 3) stores words that carry their call number, each one single-copy atomic:
a word's store is visible to the next load of it in this model (coherent), and what an adversary
can do is the order of every CTA's steps. A reader polls each word until it carries its call's
number, so stale data only delays it; a word overwritten by the peer's next call before it was
read never carries the number, and the emulator reports the deadlock (`double_buffer=False`:
one parity, which is why the kernel alternates two).
`loads="newest"` lets loads return the newest published value instead (also allowed): that is
how an overwrite by a peer's *next* call shows, which `double_buffer=False` (a model-only knob:
one staging half for every call) provokes, to show why the kernel alternates halves.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

import numpy as np

from hiercoll.kernels.fused_norm_abi import (
    LL_STAGE,
    SAFE,
    BufferLayout,
    Ordering,
    cta_active,
    cta_rows,
    ll_word,
    owner_rows,
    slot,
    split,
)

LANES = 3          # threads per CTA: element j of a row is lane j % LANES's


@dataclass(frozen=True)
class FusedCall:
    """One call: every rank's x [rows, hidden], the residual and weight (the same on every
    rank, as a model's replicated activations are), and the stage to run."""

    xs: Sequence[np.ndarray]
    residual: np.ndarray
    weight: np.ndarray
    stages: int


Key = tuple[int, str, int]       # (rank, "buf" | "sig", index)


@dataclass
class _Lane:
    floor: int = 0
    pending: list[tuple[Key, float]] = field(default_factory=list)


class _Memory:
    def __init__(self, newest: bool) -> None:
        self.history: dict[Key, list[tuple[int, float]]] = {}
        self.now = 0
        self.newest_loads = newest

    def publish(self, key: Key, value: float) -> None:
        self.now += 1
        self.history.setdefault(key, []).append((self.now, value))

    def newest(self, key: Key) -> tuple[int, float]:
        h = self.history.get(key)
        return h[-1] if h else (0, 0.0)

    def load(self, lane: _Lane, key: Key) -> float:
        for k, v in reversed(lane.pending):
            if k == key:
                return v
        seen = float("nan")
        if self.newest_loads:
            h = self.history.get(key)
            return h[-1][1] if h else seen
        for t, v in self.history.get(key, ()):
            if t > lane.floor:
                break
            seen = v
        return seen

    def flush(self, lanes: Sequence[_Lane]) -> None:
        for lane in lanes:
            for k, v in lane.pending:
                self.publish(k, v)
            lane.pending.clear()


def reference(call: FusedCall, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """float64: sum over ranks in order, + residual, RMSNorm (the model has no rounding)."""
    acc = np.zeros_like(call.xs[0], dtype=np.float64)
    for x in call.xs:
        acc = acc + x
    res = acc + call.residual
    return _norm(res, call.weight, eps), res


def _norm(res: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(res * res, axis=-1, keepdims=True)
    return res / np.sqrt(var + eps) * weight


class _Emulator:
    def __init__(self, world: int, grid: int, stride: int, calls: Sequence[FusedCall],
                 ordering: Ordering, eps: float, seed: int, loads: str = "oldest",
                 double_buffer: bool = True) -> None:
        if loads not in ("oldest", "newest"):
            raise ValueError(f"loads: {loads!r} should be 'oldest' or 'newest'")
        self.world, self.grid, self.calls, self.ord, self.eps = world, grid, calls, ordering, eps
        self.layout = BufferLayout(stride)
        self.double_buffer = double_buffer
        self.mem = _Memory(loads == "newest")
        self.rng = np.random.default_rng(seed)
        self.epoch = [[0] * grid for _ in range(world)]
        self._outs: list[dict[int, tuple[np.ndarray, np.ndarray]]] = [{} for _ in calls]
        self.ll: dict[Key, tuple[int, float]] = {}    # LL words: (call number, data)

    # ---- one CTA of one rank's call: a coroutine yielding a readiness test before each step ----
    def _cta(self, r: int, c: int, n: int, lanes: list[_Lane],
             out: tuple[np.ndarray, np.ndarray]) -> Generator[object, None, None]:
        call = self.calls[n]
        rows, hidden = call.xs[0].shape
        W, G, lay = self.world, self.grid, self.layout
        e = self.epoch[r][c] + 1
        p = e % 2                                     # signal slots
        b = p if self.double_buffer else 0            # staging halves
        if call.stages == LL_STAGE:
            yield from self._ll_cta(r, c, n, e, b, out)
            return
        r0, r1 = cta_rows(rows, W, G, call.stages, r, c)
        if not cta_active(rows, W, G, call.stages, c):    # sits the call out, as the kernel does
            self.epoch[r][c] = e
            return
        # part 0: stage the rows peers read, then signal phase 0
        if call.stages == 1:
            staged = [(r0, r1)]
        else:
            staged = [split(*_span(owner_rows(rows, W, q)), G, c) for q in range(W) if q != r]
        for a0, a1 in staged:
            for row in range(a0, a1):
                for j in range(hidden):
                    lanes[j % LANES].pending.append(
                        ((r, "buf", lay.x(b) + row * hidden + j), float(call.xs[r][row, j])))
                yield None
        yield from self._signal(r, c, p, 0, e, lanes)
        yield from self._wait(r, c, p, 0, e, lanes)
        normed, res = out
        for row in range(r0, r1):
            acc = np.zeros(hidden)
            for q in range(W):
                for j in range(hidden):
                    acc[j] += (call.xs[r][row, j] if q == r else
                               self.mem.load(lanes[j % LANES], (q, "buf", lay.x(b) + row * hidden + j)))
            res[row] = acc + call.residual[row]
            normed[row] = _norm(res[row], call.weight, self.eps)
            if call.stages == 2:
                for j in range(hidden):
                    lanes[j % LANES].pending.append(((r, "buf", lay.sums(b) + row * hidden + j),
                                                     float(acc[j])))
            yield None
        if call.stages == 2:
            yield from self._signal(r, c, p, 1, e, lanes)
            yield from self._wait(r, c, p, 1, e, lanes)
            for q in range(W):
                if q == r:
                    continue
                a0, a1 = split(*_span(owner_rows(rows, W, q)), G, c)
                for row in range(a0, a1):
                    s = np.array([self.mem.load(lanes[j % LANES],
                                                (q, "buf", lay.sums(b) + row * hidden + j))
                                  for j in range(hidden)])
                    res[row] = s + call.residual[row]        # the residual is replicated
                    normed[row] = _norm(res[row], call.weight, self.eps)
                    yield None
        self.epoch[r][c] = e

    def _ll_cta(self, r: int, c: int, n: int, e: int, b: int,
                out: tuple[np.ndarray, np.ndarray]) -> Generator[object, None, None]:
        """The LL form's CTA: push my rows' words (call number e) into region (b, me) of every
        peer's LL area, then poll my own area's words of every peer until each carries e, and
        finish the rows (the kernel's `_ll_push`, `_ll_reduce`)."""
        call = self.calls[n]
        rows, hidden = call.xs[0].shape
        r0, r1 = cta_rows(rows, self.world, self.grid, 1, r, c)
        for row in range(r0, r1):
            for q in range(self.world):
                if q != r:
                    for j in range(hidden):
                        self.ll[(q, "ll", _ll_index(b, r, row, j, hidden, self.world))] = (
                            e, float(call.xs[r][row, j]))
            yield None
        normed, res = out
        for row in range(r0, r1):
            acc = np.zeros(hidden)
            for q in range(self.world):
                for j in range(hidden):
                    if q == r:
                        acc[j] += call.xs[r][row, j]
                        continue
                    key = (r, "ll", _ll_index(b, q, row, j, hidden, self.world))
                    yield lambda key=key: self.ll.get(key, (0, 0.0))[0] == e
                    acc[j] += self.ll[key][1]
            res[row] = acc + call.residual[row]
            normed[row] = _norm(res[row], call.weight, self.eps)
            yield None
        self.epoch[r][c] = e

    def _signal(self, r: int, c: int, p: int, phase: int, e: int,
                lanes: list[_Lane]) -> Generator[object, None, None]:
        if self.ord.release:       # barrier + release: every lane's stores before the flag
            self.mem.flush(lanes)
        for q in range(self.world):
            if q != r:
                self.mem.publish((q, "sig", slot(p, phase, c, r, self.grid, self.world)), e)
                yield None

    def _wait(self, r: int, c: int, p: int, phase: int, e: int,
              lanes: list[_Lane]) -> Generator[object, None, None]:
        keys = [(r, "sig", slot(p, phase, c, q, self.grid, self.world))
                for q in range(self.world) if q != r]
        for key in keys:
            yield lambda key=key: self.mem.newest(key)[1] >= e
            if self.ord.acquire:          # the polling thread (lane 0) acquires
                lanes[0].floor = max(lanes[0].floor, self.mem.newest(key)[0])
        if self.ord.acquire and self.ord.acquire_all_threads:
            for lane in lanes:
                for key in keys:
                    lane.floor = max(lane.floor, self.mem.newest(key)[0])

    # ---- the scheduler ---------------------------------------------------------------------------
    def run(self) -> list[list[tuple[np.ndarray, np.ndarray]]]:
        W, G = self.world, self.grid
        call_of = [0] * W
        running: dict[tuple[int, int], tuple[Generator[object, None, None], object]] = {}
        lanes_of: dict[int, list[list[_Lane]]] = {}
        outs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

        def start(r: int) -> None:
            n = call_of[r]
            shape = self.calls[n].xs[0].shape
            outs[r] = (np.full(shape, np.nan), np.full(shape, np.nan))
            lanes_of[r] = [[_Lane() for _ in range(LANES)] for _ in range(G)]
            for c in range(G):
                gen = self._cta(r, c, n, lanes_of[r][c], outs[r])
                running[(r, c)] = (gen, None)

        for r in range(W):
            if self.calls:
                start(r)
        while running:
            ready = [k for k, (_, test) in running.items() if test is None or test()]  # type: ignore[operator]
            if not ready:
                raise RuntimeError("fused protocol deadlocks: "
                                   + ", ".join(f"rank {r} CTA {c}" for r, c in running))
            k = ready[int(self.rng.integers(len(ready)))]
            gen, _ = running[k]
            try:
                running[k] = (gen, next(gen))
            except StopIteration:
                del running[k]
                r = k[0]
                if not any(rr == r for rr, _ in running):      # the rank's kernel is over
                    self.mem.flush([lane for cta in lanes_of[r] for lane in cta])
                    self._outs[call_of[r]][r] = outs[r]
                    call_of[r] += 1
                    if call_of[r] < len(self.calls):
                        start(r)
        return [[done[r] for r in range(W)] for done in self._outs]


def _ll_index(parity: int, src: int, row: int, col: int, hidden: int, world: int) -> int:
    """An element's LL slot (one word per element here: the model has no packing)."""
    return ll_word(parity, src, row, 2 * col, 2 * hidden, world)   # two elements a word there


def _span(rows: tuple[int, int]) -> tuple[int, int]:
    return rows[0], rows[1] - rows[0]


def emulate(world: int, calls: Sequence[FusedCall], ordering: Ordering = SAFE,
            grid: int = 2, eps: float = 1e-6, seed: int = 0, stride: int | None = None,
            loads: str = "oldest",
            double_buffer: bool = True) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Every rank's (normed, new_residual) for every call, in rank order per call."""
    need = max(c.xs[0].size for c in calls) if calls else 1
    return _Emulator(world, grid, stride or need, calls, ordering, eps, seed, loads,
                     double_buffer).run()


def stale_calls(world: int, calls: Sequence[FusedCall], ordering: Ordering, grid: int = 2,
                seed: int = 0, eps: float = 1e-6, loads: str = "oldest",
                double_buffer: bool = True) -> list[int]:
    """The calls in which some rank's output differs from the reference (1e-9 relative)."""
    outs = emulate(world, calls, ordering, grid, eps, seed, loads=loads,
                   double_buffer=double_buffer)
    bad = []
    for n, call in enumerate(calls):
        want_n, want_r = reference(call, eps)
        for got_n, got_r in outs[n]:
            if not (np.allclose(got_n, want_n, rtol=1e-9, atol=1e-12)
                    and np.allclose(got_r, want_r, rtol=1e-9, atol=1e-12)):
                bad.append(n)
                break
    return bad
