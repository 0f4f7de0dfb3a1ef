"""NCCL's own costs (`costs.library`): the library model is timed with them, hiercoll's plans are
not, and calibrate fits them as parameters of their own (a graph replay of NCCL's call is not
our kernel's)."""

from __future__ import annotations

import pytest

from hiercoll.calibration.measurement import Measurement
from hiercoll.calibration.params import BY_PATH, with_values
from hiercoll.calibration.predict import build_case, predict_us
from hiercoll.topology import load_topology


def _m(algorithm: str, mode: str) -> Measurement:
    return Measurement(source="t#0", tool="hiercoll-bench", collective="all_reduce",
                       algorithm=algorithm, world_size=4, dtype="bf16", nbytes=8192, mode=mode,
                       time_us=10.0, statistic="p50",
                       params={} if algorithm == "nccl" else {"channels": 1, "chunks": 1})


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_library_costs_move_the_library_model_only(mode):
    base = load_topology("h200x4", uncalibrated=True)      # no library costs of its own
    nccl, ring = build_case(_m("nccl", mode), base), build_case(_m("ring", mode), base)
    nccl_before, ring_before = predict_us(nccl, base, base), predict_us(ring, base, base)
    call = f"costs.library.{mode}_call_us"
    bumped = with_values(base, {"costs.library.launch_us": 0.5, call: 500.0})
    assert bumped.costs.library.launch_us == 0.5 and BY_PATH[call].get(bumped) == 500.0
    assert predict_us(ring, bumped, base) == pytest.approx(ring_before)       # ours: unchanged
    assert predict_us(nccl, bumped, base) >= 490.0 > nccl_before              # NCCL's call cost
    assert BY_PATH[call].get(base) is None          # unset: the plans' own costs, as before


def test_an_unset_library_cost_keeps_the_fingerprint():
    base = load_topology("h200x4")
    assert with_values(base, {}).fingerprint() == base.fingerprint()
    assert with_values(base, {"costs.library.launch_us": 1.0}).fingerprint() != base.fingerprint()


def test_pull_efficiency_slows_reduces_that_read_peers_and_nothing_else():
    """A reduce's reads of peer memory cost the link 1/pull_efficiency per byte (the lowered
    direct reduce-scatter pulls its shards); copies and the default (1.0, fingerprint
    unchanged) are as before."""
    import hiercoll as hc
    base = load_topology("h200x4", uncalibrated=True)      # pull_efficiency at its default
    assert with_values(base, {"costs.pull_efficiency": 1.0}).fingerprint() == base.fingerprint()
    slow = with_values(base, {"costs.pull_efficiency": 0.25})
    big = 16 << 20          # copies of 2 MiB: SMs, so forwarded (8 MiB and up: copy engines)

    def t(kind: str, algorithm: str, topo) -> float:
        from hiercoll.sim.forwarding import forward_on_sms
        s = hc.plan(base, hc.CollectiveSpec(kind=kind, world_size=4, nbytes=big), algorithm)
        lowered = forward_on_sms(s, base.costs.ce_threshold_bytes)      # reduces pull
        return hc.simulate(lowered, base, costs_from=topo).time_us

    assert t("reduce_scatter", "direct", slow) > 1.5 * t("reduce_scatter", "direct", base)
    assert t("all_gather", "direct", slow) == pytest.approx(t("all_gather", "direct", base))
