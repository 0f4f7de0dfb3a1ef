import numpy as np
import pytest
from pydantic import ValidationError

from hiercoll.collectives import (
    CollectiveSpec,
    DType,
    GroupSplits,
    Kind,
    RankSplits,
    Split,
    random_inputs,
    reference,
    round_to,
)
from tests.helpers import random_group_cast, random_group_reduce


def spec(kind, world=4, nbytes=64, **kw):
    return CollectiveSpec(kind=kind, world_size=world, dtype="fp32", nbytes=nbytes, **kw)


def test_layouts_follow_nccl_tests():
    s = spec("reduce_scatter", 4, 4 * 10)  # 10 elements, 4 shards: 3,3,2,2
    assert [s.shard(i) for i in range(4)] == [(0, 3), (3, 3), (6, 2), (8, 2)]
    assert s.input_count(0) == 10 and s.output_count(3) == 2
    ag = spec("all_gather", 4, 4 * 10)
    assert ag.input_count(1) == 3 and ag.output_count(1) == 10
    b = spec("broadcast", 4, 40, root=2)
    assert b.input_count(2) == 10 and b.input_count(0) == 0
    r = spec("reduce", 4, 40, root=1)
    assert r.output_count(1) == 10 and r.output_count(0) == 0


def test_busbw_factors():
    ar = spec("all_reduce", 4, 1 << 20)
    algbw, busbw = ar.bandwidths_gbps(100.0)
    assert algbw == pytest.approx((1 << 20) / 100e3)
    assert busbw == pytest.approx(algbw * 1.5)
    assert spec("all_gather", 8, 64).busbw_factor == pytest.approx(7 / 8)
    assert spec("broadcast", 8, 64).busbw_factor == 1.0


@pytest.mark.parametrize("kw,match", [
    (dict(kind="all_to_all", nbytes=4 * 6), "multiple of world_size"),
    (dict(kind="all_reduce", nbytes=6), "not a multiple of the fp32 element size"),
    (dict(kind="broadcast", nbytes=16, root=9), "root: 9 is outside"),
    (dict(kind="group_cast"), "needs --splits"),
])
def test_spec_errors_name_the_field(kw, match):
    with pytest.raises(ValidationError, match=match):
        CollectiveSpec(world_size=4, dtype="fp32", **kw)


def test_group_splits_inconsistent_sizes_rejected():
    splits = GroupSplits(ranks=[
        RankSplits(input=[Split(size=4, peers=[1])], output=[]),
        RankSplits(input=[], output=[Split(size=3, peers=[0])]),
    ])
    with pytest.raises(ValidationError, match="rank 0 sends 4 elements to rank 1 but rank 1"):
        CollectiveSpec(kind="group_cast", world_size=2, splits=splits)
    two_src = GroupSplits(ranks=[RankSplits(input=[], output=[Split(size=1, peers=[0, 1])]),
                                 RankSplits()])
    with pytest.raises(ValidationError, match=r"output\[0\].peers: a group_cast output split has exactly one"):
        CollectiveSpec(kind="group_cast", world_size=2, splits=two_src)


def test_reference_all_reduce_and_all_to_all():
    rng = np.random.default_rng(0)
    s = spec("all_reduce", 3, 4 * 5)
    x = random_inputs(s, rng)
    assert all(np.all(a != 0) for a in x)
    exp = reference(s, x)
    np.testing.assert_allclose(exp.outputs[2], sum(a.astype(np.float64) for a in x))
    a2a = spec("all_to_all", 2, 4 * 4)
    x = [np.arange(4.0), np.arange(4.0) + 10]
    exp = reference(a2a, x)
    np.testing.assert_array_equal(exp.outputs[0], [0, 1, 10, 11])
    np.testing.assert_array_equal(exp.outputs[1], [2, 3, 12, 13])


def test_reference_group_cast_follows_streams():
    splits = GroupSplits(ranks=[
        RankSplits(input=[Split(size=2, peers=[1]), Split(size=1, peers=[0, 1])],
                   output=[Split(size=1, peers=[0])]),
        RankSplits(input=[], output=[Split(size=1, peers=[0]), Split(size=2, peers=[0])]),
    ])
    s = CollectiveSpec(kind="group_cast", world_size=2, dtype="fp32", splits=splits)
    exp = reference(s, [np.array([1.0, 2.0, 3.0]), np.zeros(0)])
    np.testing.assert_array_equal(exp.outputs[1], [1, 2, 3])
    np.testing.assert_array_equal(exp.outputs[0], [3])


def test_reference_group_reduce_accumulates_and_averages():
    splits = GroupSplits(ranks=[
        RankSplits(input=[Split(size=2, peers=[1])], output=[]),
        RankSplits(input=[Split(size=2, peers=[1])], output=[Split(size=2, peers=[0, 1])]),
    ])
    s = CollectiveSpec(kind="group_reduce", world_size=2, dtype="fp32", splits=splits,
                       reduce_op="avg")
    exp = reference(s, [np.array([1.0, 2.0]), np.array([3.0, 4.0])],
                    [np.zeros(0), np.array([10.0, 20.0])])
    np.testing.assert_array_equal(exp.outputs[1], [12, 23])


@pytest.mark.parametrize("seed", range(5))
def test_random_splits_are_consistent(seed):
    CollectiveSpec(kind="group_cast", world_size=4, splits=random_group_cast(4, seed))
    CollectiveSpec(kind="group_reduce", world_size=4, splits=random_group_reduce(4, seed))


def test_bf16_rounding_is_round_to_nearest_even():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-9, -2.5], dtype=np.float32)
    got = round_to(x, DType.BF16)
    np.testing.assert_array_equal(got, [1.0, 1.0, 1.0 + 4 * 2**-8, 1.0, -2.5])


def test_kinds_are_all_covered_by_reference():
    rng = np.random.default_rng(1)
    for kind in Kind:
        if kind in (Kind.GROUP_CAST, Kind.GROUP_REDUCE):
            maker = random_group_cast if kind == Kind.GROUP_CAST else random_group_reduce
            s = CollectiveSpec(kind=kind, world_size=3, splits=maker(3, 7))
        else:
            s = spec(kind, 3, 4 * 6)
        x = random_inputs(s, rng)
        before = [np.zeros(s.output_count(r)) for r in range(3)]
        exp = reference(s, x, before)
        assert [len(o) for o in exp.outputs] == [s.output_count(r) for r in range(3)]


def test_transpose_turns_group_cast_into_group_reduce():
    from hiercoll.collectives import transpose
    cast = random_group_cast(4, 3)
    reduce_spec = CollectiveSpec(kind="group_reduce", world_size=4, splits=transpose(cast))
    cast_spec = CollectiveSpec(kind="group_cast", world_size=4, splits=cast)
    # what d received from s in the cast, d now sends back to s
    assert {k: v.total for k, v in reduce_spec.pair_streams.items()} == \
        {(d, s): v.total for (s, d), v in cast_spec.pair_streams.items()}
    assert transpose(transpose(cast)) == cast


def _alltoallv_by_hand(counts):
    w = len(counts)
    return GroupSplits(ranks=[RankSplits(input=[Split(size=counts[r][d], peers=[d]) for d in range(w)],
                                         output=[Split(size=counts[s][r], peers=[s]) for s in range(w)])
                              for r in range(w)])


def test_from_counts_equals_splits_built_by_hand_and_round_trips():
    counts = np.random.default_rng(3).integers(0, 5, (5, 5))
    fast = GroupSplits.from_counts(counts)
    assert fast == _alltoallv_by_hand(counts.tolist())
    assert GroupSplits.model_validate(fast.model_dump()) == fast


@pytest.mark.parametrize("kind", ["group_cast", "group_reduce"])
def test_from_counts_pair_streams_read_off_the_matrix_equal_the_general_walk(kind):
    """from_counts' splits keep their matrix beside them: validation and pair streams read it
    instead of W^2 splits; the same splits loaded from a file (no matrix) must agree."""
    from hiercoll.collectives import dense_counts
    counts = np.random.default_rng().integers(0, 4, (6, 6))
    counts[2, 3] = 0
    fast = GroupSplits.from_counts(counts)
    plain = GroupSplits.model_validate(fast.model_dump())
    assert dense_counts(fast) is not None and dense_counts(plain) is None
    assert dense_counts(fast, 6) is not None and dense_counts(fast, 7) is None
    a = CollectiveSpec(kind=kind, world_size=6, dtype="fp32", splits=fast)
    b = CollectiveSpec(kind=kind, world_size=6, dtype="fp32", splits=plain)
    assert list(a.pair_streams.items()) == list(b.pair_streams.items())
    assert a == b          # the matrix beside the model does not change what the model is


def test_from_counts_means_all_to_all_v():
    """Rank d's output piece from s is s's input at s's packed offset for d (MPI_Alltoallv)."""
    rng = np.random.default_rng()
    w = 4
    counts = rng.integers(0, 4, (w, w))
    counts[0, 1] = 3                              # at least one element moves between ranks
    s = CollectiveSpec(kind="group_cast", world_size=w, dtype="fp32",
                       splits=GroupSplits.from_counts(counts))
    inputs = random_inputs(s, rng)
    out = reference(s, inputs).outputs
    for src in range(w):
        for dst in range(w):
            sent = inputs[src][counts[src, :dst].sum():][:counts[src, dst]]
            got = out[dst][counts[:src, dst].sum():][:counts[src, dst]]
            np.testing.assert_array_equal(got, sent)


@pytest.mark.parametrize(("counts", "match"), [
    ([[1, 2, 3]], r"counts: shape \(1, 3\); give a square"),
    ([[1, -2], [0, 1]], r"counts\[0\]\[1\] = -2; element counts are >= 0"),
    ([[1.5, 2], [0, 1]], r"counts: dtype float64; give whole numbers"),
    ([[1, [2]], [0, 1]], r"counts: not a matrix"),
    ([[1.0, float("inf")], [0, 1]], r"counts: dtype float64; give whole numbers"),
    ([[1, 1e19], [0, 1]], r"counts\[0\]\[1\] = 1e\+19; element counts are >= 0 and < 2\*\*63"),
])
def test_from_counts_names_what_is_wrong(counts, match):
    with pytest.raises(ValueError, match=match):
        GroupSplits.from_counts(counts)


@pytest.mark.parametrize("algo", ["direct", "hier"])
def test_plans_of_an_all_to_all_v_from_counts_pass_the_reference_executor(algo):
    import hiercoll as hc
    from hiercoll.executor.reference import verify
    from tests.helpers import small_topology
    topo = small_topology(2, 2)
    counts = np.random.default_rng().integers(0, 6, (4, 4))
    counts[1, 2] = 5
    s = CollectiveSpec(kind="group_cast", world_size=4, dtype="fp32",
                       splits=GroupSplits.from_counts(counts))
    assert verify(hc.plan(topo, s, algo), trials=2).ok
