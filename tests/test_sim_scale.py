"""What makes the unfolded simulator scale keeps its answers: links that cannot fill left out of
max-min change no rate, pair streams in one pass equal the per-pair definition, a recipe builds
each rank once however often a consumer walks them, and irregular plans time the same folded or
exact."""

from __future__ import annotations

import random

import pytest

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec, PairStream, Segment, Split, _zip_ranges
from hiercoll.sim.fluid import HEAP_ABOVE_LINKS, SLACK_MARGIN, Flow, _fill_by_heap, _fill_by_scan, max_min_rates
from tests.helpers import random_group_cast, random_group_reduce


def _ranges(splits: list[Split], peer: int) -> list[tuple[int, int]]:
    """The definition: peer's ranges of one rank's splits, in split order."""
    out, pos = [], 0
    for sp in splits:
        if peer in sp.peers and sp.size > 0:
            out.append((pos, sp.size))
        pos += sp.size
    return out


@pytest.mark.parametrize("seed", range(6))
def test_pair_streams_equal_the_per_pair_definition(seed: int) -> None:
    rng = random.Random()
    w = rng.randint(2, 9)
    for kind, splits in (("group_cast", random_group_cast(w, rng.randrange(1 << 30), 9)),
                         ("group_reduce", random_group_reduce(w, rng.randrange(1 << 30), 9))):
        spec = CollectiveSpec(kind=kind, world_size=w, dtype="fp32", splits=splits)
        want: dict[tuple[int, int], PairStream] = {}
        for s in range(w):
            for d in range(w):
                src = _ranges(splits.ranks[s].input, d)
                if src:
                    segs: list[Segment] = _zip_ranges(src, _ranges(splits.ranks[d].output, s))
                    want[(s, d)] = PairStream(s, d, tuple(segs), sum(x.count for x in segs))
        assert spec.pair_streams == want
        assert list(spec.pair_streams) == sorted(want)


def test_links_that_cannot_fill_change_no_rate() -> None:
    """Random flows on random links: max-min over every link, and over only the links whose
    flows' summed best rates reach their capacity, give the same rates, bit for bit."""
    rng = random.Random()
    for _ in range(200):
        n = rng.randint(2, 12)
        cap = [rng.choice([100.0, 450.0, 50.0, 3000.0]) * rng.uniform(0.5, 2) for _ in range(n)]
        flows = set()
        for _ in range(rng.randint(1, 15)):
            lids = rng.sample(range(n), rng.randint(1, min(4, n)))
            links = tuple((lid, rng.choice([1.0, 2.0, 1.5, 0.5])) for lid in lids)
            flows.add(Flow(links, 1.0, ceiling=min(cap[l] / w for l, w in links)))
        demand = [0.0] * n
        for f in flows:
            for lid, w in f.links:
                demand[lid] += w * f.ceiling
        used = {lid for f in flows for lid, _ in f.links}
        full = max_min_rates(flows, used, cap)
        binding = {lid for lid in used if demand[lid] > cap[lid] * (1 - SLACK_MARGIN)}
        assert binding != used or all(demand[l] >= cap[l] * (1 - SLACK_MARGIN) for l in used)
        assert max_min_rates(flows, binding, cap) == full


def test_heap_and_scan_filling_agree() -> None:
    """Large problems fill by heap, small ones by scan: on random flows over up to 200 links
    (ties between equal links included) both give the same rates to rounding, and so do the
    network's kept per-link weights and flow sets against counting them afresh."""
    rng = random.Random()
    for _ in range(300):
        n = rng.randint(2, 200)
        cap = [rng.choice([100.0, 450.0, 50.0, 3000.0]) * rng.choice([1, 0.5, 2]) for _ in range(n)]
        flows = [Flow(tuple((lid, rng.choice([1.0, 2.0, 1.5, 0.5]))
                            for lid in rng.sample(range(n), rng.randint(1, min(6, n)))), 1.0)
                 for _ in range(rng.randint(1, 300))]
        weights, on = [0.0] * n, [set() for _ in range(n)]
        for f in flows:
            for lid, w in f.links:
                weights[lid] += w
                on[lid].add(f)
        scan = _fill_by_scan({lid: on[lid] for lid in range(n)}, dict(enumerate(weights)), cap)
        heap = _fill_by_heap({lid: on[lid] for lid in range(n)}, dict(enumerate(weights)), cap)
        assert scan.keys() == heap.keys() == set(flows)
        assert all(heap[f] == pytest.approx(scan[f], rel=1e-12) for f in flows)
        kept = max_min_rates(set(flows), set(range(n)), cap, weights, on)
        assert kept == max_min_rates(set(flows), set(range(n)), cap)
    assert HEAP_ABOVE_LINKS < 200


def test_a_recipe_builds_each_rank_once_over_repeated_walks() -> None:
    topo = hc.load_topology("dgx-h100", 16)            # 128 ranks: more than the first cache
    spec = CollectiveSpec(kind="all_reduce", world_size=128, dtype="bf16", nbytes=128 << 10)
    sched = hc.plan(topo, spec, "ring", {})
    ctx = sched.source.ctx  # type: ignore[attr-defined]
    built: list[int] = []
    real = ctx.build
    ctx.build = lambda r: (built.append(r), real(r))[1]
    counts, after = set(), []
    for _ in range(4):
        counts.add(sum(len(sched.rank_ops(r)) for r in range(128)))
        after.append(len(built))
    # the first walk builds every rank, the second rebuilds those the small cache had dropped
    # (once: it then keeps every rank), the later ones build nothing
    assert len(counts) == 1 and counts.pop() > 128 * 127
    assert after[0] == 128 and after[1] < 2 * 128 and after[3] == after[1]
    assert sorted(set(built)) == list(range(128))


@pytest.mark.parametrize("algo", ["hier", "direct"])
def test_irregular_group_cast_times_the_same_folded_or_exact(algo: str) -> None:
    """No symmetry here, so `auto` falls back to every rank: same path as exact, and both
    finish; the time is at least the lower bound."""
    topo = hc.load_topology("dgx-h100", 4)
    splits = random_group_cast(32, random.randrange(1 << 30), 4096)
    spec = CollectiveSpec(kind="group_cast", world_size=32, dtype="bf16", splits=splits)
    s = hc.plan(topo, spec, algo, {"chunks": 2})
    auto, exact = hc.simulate(s, topo), hc.simulate(s, topo, mode="exact")
    assert auto.shortcut is None and auto.time_us == exact.time_us
    assert exact.time_us >= exact.lower_bound_us * (1 - 1e-9)
