"""When the communicator's copies through its pool make NCCL's own call the faster choice
(hiercoll/torch/staging.py), on the shipped 2 x H200 measurements."""

from __future__ import annotations

import pytest
from helpers import ROOT

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.executor.cuda.lowering import CudaOptions, ll_applies
from hiercoll.planner.search.select import plan_with
from hiercoll.topology import load_topology
from hiercoll.torch.staging import library_beats_staged, staging_us


def test_the_staging_model_goes_through_its_two_measured_points():
    assert staging_us(1 << 20) == pytest.approx(3.31, abs=0.01)
    assert staging_us(16 << 20) == pytest.approx(14.86, abs=0.02)


def test_unknown_times_and_zero_copy_plans_decide_nothing():
    assert not library_beats_staged(None, 5.0, 1 << 20, False)
    assert not library_beats_staged(5.0, None, 1 << 20, False)
    assert not library_beats_staged(13.0, 13.5, 1 << 20, True)      # LL: no copies
    assert library_beats_staged(13.0, 13.5, 1 << 20, False)
    assert not library_beats_staged(9.0, 13.5, 1 << 20, False)


@pytest.mark.parametrize(("nbytes", "library"), [(8 << 10, False), (256 << 10, False),
                                                 (1 << 20, False)])
def test_on_two_h200s_the_copies_are_counted_and_small_sizes_stay_ours(nbytes, library):
    """Measured (bench/results/gpu/large-w2/mid): 1 MiB `hier_2d` 11.9 us on its own buffers,
    NCCL's call 15.8; through the pool the plan pays ~3.3 us of copies (15.2), still ours. (With
    the 13.4 us of ll-w2's kernels, 16.7 against NCCL's 16.1 handed it to NCCL.) At 8 and 256
    KiB the pick is an LL plan, which runs on the caller's tensors."""
    two = load_topology(str(ROOT / "bench/gpu/topologies/h200x2.yaml"), uncalibrated=True)
    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=2, nbytes=nbytes)
    chosen = plan_with(two, spec, "auto")
    assert chosen.how == "searched (measured)" and chosen.measured_us and chosen.library_us
    zero_copy = ll_applies(chosen.schedule, CudaOptions()) is not None
    assert zero_copy is (nbytes <= 256 << 10)
    assert library_beats_staged(chosen.measured_us, chosen.library_us, nbytes, zero_copy) is library
    if not zero_copy:     # ll-w2's 13.4 us kernel would have lost to NCCL through the pool
        assert library_beats_staged(13.4, chosen.library_us, nbytes, zero_copy)
