import json

import pytest

from hiercoll.errors import HiercollError
from hiercoll.topology import Topology, load_topology, preset, preset_names


def test_presets_load_with_node_counts():
    for name in preset_names():
        if name.startswith("one-gpu-"):
            with pytest.raises(HiercollError, match="one GPU"):
                preset(name, 3)
            continue
        t = preset(name, 3)
        assert t.num_nodes == 3 and t.world_size == 3 * t.gpus_per_node
    assert {"h200x4", "dgx-h100", "dgx-h200", "mi300x", "pcie-8gpu"} <= set(preset_names())
    assert preset("h200x4").num_nodes == 1
    # measured copy-engine peer bandwidth on the 4xH200 host (shared/measurements)
    assert preset("h200x4").intra.gbps == pytest.approx(380.5)


def test_rank_helpers():
    t = preset("dgx-h100", 4)
    assert t.node_of(19) == 2 and t.local_rank_of(19) == 3 and t.rank_of(2, 3) == 19
    assert t.node_peers(9) == list(range(8, 16))
    assert t.rail_peers(9) == [1, 9, 17, 25]
    assert t.same_node(8, 15) and not t.same_node(7, 8)


def test_nic_affinity_with_fewer_nics():
    t = preset("pcie-8gpu", 2)
    assert t.nic_affinity() == [0, 4]
    assert [t.nic_of_local_rank(lr) for lr in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_fingerprint_stable_and_sensitive():
    a, b = preset("dgx-h100", 2), preset("dgx-h100", 2)
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != preset("dgx-h100", 4).fingerprint()
    assert a.fingerprint() != preset("dgx-h200", 2).fingerprint()
    renamed = a.model_copy(update={"name": "other"})
    assert renamed.fingerprint() == a.fingerprint()  # the display name does not shape a plan


def test_file_round_trip(tmp_path):
    t = preset("mi300x", 2)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(t.model_dump(mode="json")))
    assert load_topology(str(path)) == t
    assert load_topology(str(path), nodes=3).num_nodes == 3


@pytest.mark.parametrize("content,match", [
    ("num_nodes: 2\ngpus_per_node: 8\n", r"gpu: required field is missing"),
    ("{", r"not valid YAML"),
    ("- 1\n- 2\n", r"expected a mapping"),
])
def test_bad_files_one_line(tmp_path, content, match):
    path = tmp_path / "t.yaml"
    path.write_text(content)
    with pytest.raises(HiercollError, match=match) as info:
        load_topology(str(path))
    assert "\n" not in str(info.value)


def test_validation_messages():
    base = preset("dgx-h100", 1).model_dump(mode="json")
    with pytest.raises(ValueError, match="inter: a topology with num_nodes > 1"):
        Topology.model_validate(base | {"num_nodes": 2, "inter": None})
    bad = base | {"inter": base["inter"] | {"nic_affinity": [0, 1]}}
    with pytest.raises(ValueError, match="nic_affinity: has 2 entries for 8 NICs"):
        Topology.model_validate(bad)
    with pytest.raises(HiercollError, match="unknown preset|neither a preset"):
        load_topology("dgx-a100")
