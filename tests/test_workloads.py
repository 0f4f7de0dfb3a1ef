import hiercoll as hc
from hiercoll.executor.reference import verify
from hiercoll.workloads import causal_kv_group_cast


def test_contiguous_causal_needs_every_earlier_rank():
    g = causal_kv_group_cast(4, kv_per_chunk=5)
    assert [sp.peers for sp in g.ranks[0].input] == [[1, 2, 3]]
    assert [sp.peers for sp in g.ranks[2].output] == [[0], [1]]
    assert g.ranks[3].input[0].size == 5 and g.ranks[3].input[0].peers == []  # nobody's past


def test_zigzag_layout_verifies():
    g = causal_kv_group_cast(4, kv_per_chunk=3, layout="zigzag")
    spec = hc.CollectiveSpec(kind="group_cast", world_size=4, splits=g)
    # rank 0 holds chunks 0 and 7: it needs 1..6
    assert len(g.ranks[0].output) == 6
    s = hc.plan(hc.load_topology("h200x4"), spec, "direct")
    assert verify(s, trials=2, seed=3).ok


def test_causal_kv_group_cast_input_is_the_whole_local_kv_block():
    """A chunk nobody needs (the last rank's) stays in its input with no destination: the input
    of every rank is its real KV block, which the caller passes as it is."""
    import hiercoll as hc
    from hiercoll.workloads.cp_attention import causal_kv_group_cast
    for layout, chunks in (("contiguous", 1), ("zigzag", 2)):
        splits = causal_kv_group_cast(4, 6, layout)
        spec = hc.CollectiveSpec(kind="group_cast", world_size=4, dtype="fp32", splits=splits)
        assert [spec.input_count(r) for r in range(4)] == [6 * chunks] * 4
        if layout == "contiguous":
            assert splits.ranks[3].input[-1].peers == []
