"""`hiercoll topo detect`: parsers over recorded tool outputs (hand-written fixtures for four kinds
of node, and one recorded on the lent H200 VM), the topology they build, the CLI, and the
`topo show --json` round trip."""

from __future__ import annotations

import json
import random
import types
from pathlib import Path

import pytest
import yaml

from hiercoll.cli.main import main
from hiercoll.errors import HiercollError
from hiercoll.topology import load_topology
from hiercoll.topology.detect import Overrides, build, facts_from_texts, read_recorded
from hiercoll.topology.detect.build import compute_nics, nic_affinity
from hiercoll.topology.detect.facts import NicFacts
from hiercoll.topology.detect.nvidia_smi import parse_nvlink_status, parse_query, parse_topo_matrix
from hiercoll.topology.detect.nvml import read_nvml
from hiercoll.topology.detect.sysfs import dump_sysfs, parse_sysfs_dump
from hiercoll.topology.load import topology_from_dict

FIX = Path(__file__).parent / "fixtures" / "detect"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _detect(box: str, nodes: int = 2, **kw):
    return build(facts_from_texts(read_recorded(FIX / box)), Overrides(nodes=nodes, **kw))


# ---- what each kind of node gives -----------------------------------------------------------------
def test_dgx_h100_nvswitch_rails_and_side_nics_left_out():
    d = _detect("dgx-h100")
    t = topology_from_dict(d.topology, "dgx-h100")
    assert (t.num_nodes, t.gpus_per_node, t.gpu.name, t.intra.kind.value) == (2, 8, "H100", "nvswitch")
    assert t.intra.gbps == pytest.approx(18 * 26.562 * 380.5 / 478.0, rel=1e-3)
    assert t.inter is not None and t.inter.num_nics == 8 and t.inter.nic_gbps == pytest.approx(50 * 0.92)
    assert t.nic_affinity() == list(range(8))
    assert any("mlx5_8" in s and "PCIe switch" in s for s in d.seen)     # storage NIC on the CPU
    assert any("mlx5_9" in s and "inactive" in s for s in d.seen)


def test_h200x4_direct_nvlink_is_a_mesh():
    t = topology_from_dict(_detect("h200x4").topology, "h200x4")
    assert t.intra.kind.value == "mesh" and t.intra.links_per_pair == 6
    assert t.gpu_intra_gbps() == pytest.approx(3 * 6 * 26.562 * 380.5 / 478.0, rel=1e-3)
    assert t.inter is not None and t.nic_affinity() == [0, 1, 2, 3]


def test_mi300x_xgmi_mesh_without_pcie_distances():
    d = _detect("mi300x")
    t = topology_from_dict(d.topology, "mi300x")
    assert (t.gpu.name, t.intra.kind.value, t.intra.links_per_pair, t.gpus_per_node) == ("MI300X", "mesh", 1, 8)
    assert t.inter is not None and t.inter.nic_affinity is None and t.inter.num_nics == 8
    assert any("nic_affinity" in a for a in d.assumed)


def test_pcie_box_two_ethernet_nics_at_their_sockets():
    t = topology_from_dict(_detect("pcie-l40s").topology, "pcie")
    assert (t.gpu.name, t.intra.kind.value) == ("L40S", "pcie")
    assert t.intra.gbps == pytest.approx(16 * 1.969, abs=0.1)          # Gen4 x16 from nvidia-smi -q
    assert t.inter is not None and t.nic_affinity() == [0, 4] and t.inter.nic_gbps == pytest.approx(12.5 * 0.92)


def test_more_nics_than_gpus_become_one_faster_nic_per_gpu():
    """A GPU sends through one NIC in the model: 8 NICs of 25 GB/s on 4 GPUs are 4 of 50."""
    d = _detect("h200x4", num_nics=8, nic_gbps=25.0)
    t = topology_from_dict(d.topology, "h200x4")
    assert t.inter is not None and (t.inter.num_nics, t.inter.nic_gbps) == (4, 50.0)
    assert any("8 NICs for 4 GPUs" in a for a in d.assumed)


def test_recorded_on_the_h200_vm_matches_the_committed_result():
    """The fixture is the raw output committed in bench/results/detect; it must give the file the
    device wrote (same fingerprint)."""
    d = _detect("h200-vm", nodes=1)
    t = topology_from_dict(d.topology, "h200-vm")
    committed = Path(__file__).resolve().parents[1] / "bench/results/detect/topology.yaml"
    want = load_topology(str(committed))
    assert t.fingerprint() == want.fingerprint() and t.gpu.name == "H200" and t.gpus_per_node == 1


def test_overrides_replace_assumptions_and_multi_node_needs_a_nic():
    d = _detect("dgx-h100", intra_latency_us=0.7, inter_latency_us=4.5, nic_gbps=44.0, oversubscription=2.0)
    assert d.topology["intra"]["latency_us"] == 0.7 and d.topology["inter"]["latency_us"] == 4.5
    assert d.topology["inter"]["nic_gbps"] == 44.0 and d.topology["inter"]["oversubscription"] == 2.0
    assert not any(a.startswith(("intra.latency_us", "inter.latency_us", "inter.nic_gbps", "inter.oversub")) for a in d.assumed)
    texts = read_recorded(FIX / "h200-vm")
    with pytest.raises(HiercollError, match="--nic-gbps"):
        build(facts_from_texts(texts), Overrides(nodes=2))
    t = build(facts_from_texts(texts), Overrides(nodes=2, nic_gbps=25.0, num_nics=1)).topology
    assert t["inter"]["num_nics"] == 1 and t["inter"]["nic_gbps"] == 25.0


def test_unknown_gpu_needs_its_numbers():
    texts = read_recorded(FIX / "h200x4")
    texts["nvidia-smi-q.txt"] = texts["nvidia-smi-q.txt"].replace("NVIDIA H200", "NVIDIA Z9000")
    with pytest.raises(HiercollError, match="--hbm-gbps"):
        build(facts_from_texts(texts), Overrides())
    d = build(facts_from_texts(texts), Overrides(hbm_gbps=1234.0, num_sms=77))
    assert d.topology["gpu"]["hbm_gbps"] == 1234.0 and d.topology["gpu"]["num_sms"] == 77


# ---- parsers on their own ------------------------------------------------------------------------
def test_topo_matrix_random_nvlinks_and_old_style_nic_names():
    rng = random.Random()
    n = rng.randint(2, 8)
    links = {(i, j): rng.choice([0, 1, 2, 4, 6, 12]) for i in range(n) for j in range(i + 1, n)}

    def cell(i, j):
        if i == j:
            return "X"
        k = links[(min(i, j), max(i, j))]
        return f"NV{k}" if k else "SYS"
    nic_gpu = rng.randrange(n)
    lines = ["\t" + "\t".join(f"GPU{j}" for j in range(n)) + "\tmlx5_0\tCPU Affinity\tNUMA Affinity"]
    lines += [f"GPU{i}\t" + "\t".join(cell(i, j) for j in range(n)) + f"\t{'PIX' if i == nic_gpu else 'SYS'}\t0-7\t0"
              for i in range(n)]
    lines += ["mlx5_0\t" + "\t".join("PIX" if i == nic_gpu else "SYS" for i in range(n)) + "\t X", "", "Legend:"]
    count, got, nics, _ = parse_topo_matrix("\n".join(lines))
    assert count == n and got == {k: v for k, v in links.items() if v}
    assert [x.name for x in nics] == ["mlx5_0"] and nic_affinity(nics, n) == [nic_gpu]


def test_parsers_refuse_what_they_do_not_know():
    for parse in (parse_topo_matrix, parse_query, parse_nvlink_status):
        with pytest.raises(HiercollError):
            parse("hello\nworld\n")
    with pytest.raises(HiercollError, match="no GPU tool output"):
        facts_from_texts({"sysfs.txt": ""})


def test_query_fabric_state_and_memory():
    gpus, fabric = parse_query((FIX / "dgx-h100/nvidia-smi-q.txt").read_text())
    assert fabric is True and len(gpus) == 8 and gpus[0].memory_mib == 81559 and gpus[0].pcie_gen == 5
    assert gpus[3].pci == "0000:5d:00.0"
    _, fabric = parse_query((FIX / "h200x4/nvidia-smi-q.txt").read_text())
    assert fabric is False


def test_sysfs_dump_of_a_fake_tree_round_trips(tmp_path):
    rate = random.choice([100, 200, 400])
    dev = tmp_path / "devices/pci0000:00/0000:3b:00.0"
    (dev).mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    port = tmp_path / "class/infiniband/mlx5_3/ports/1"
    port.mkdir(parents=True)
    (port / "rate").write_text(f"{rate} Gb/sec (4X)\n")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (tmp_path / "class/infiniband/mlx5_3/device").symlink_to(dev)
    nics = parse_sysfs_dump(dump_sysfs(tmp_path / "class"))
    assert len(nics) == 1 and nics[0].gbps == rate / 8 and nics[0].pci == "0000:3b:00.0" and nics[0].numa == 1


def test_compute_nics_keeps_the_fastest_near_a_gpu():
    a = NicFacts("a", gbps=50.0, gpu_level={0: "PIX"})
    b = NicFacts("b", gbps=25.0, gpu_level={1: "PXB"})
    c = NicFacts("c", gbps=50.0, gpu_level={0: "SYS"})
    assert compute_nics([a, b, c]) == [a]
    assert compute_nics([NicFacts("x", gbps=12.5), NicFacts("y", gbps=None)])[0].name == "x"


def test_nvml_through_a_fake_module():
    """Four GPUs, each with 6 links to every peer (a mesh), read through a stand-in for pynvml."""
    buses = [f"00000000:{b:02X}:00.0" for b in (0x18, 0x38, 0x9A, 0xBA)]
    peer_of = {(i, l): (i + 1 + l // 6) % 4 for i in range(4) for l in range(18)}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 4,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=141 << 30),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=buses[h].encode()),
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5, nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetNvLinkState=lambda h, l: 1, nvmlDeviceGetNvLinkVersion=lambda h, l: 4,
        nvmlDeviceGetNvLinkRemoteDeviceType=lambda h, l: 0,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, l: types.SimpleNamespace(busId=buses[peer_of[(h, l)]]))
    facts = read_nvml(fake)
    assert facts is not None and facts.switch is False and facts.link_gbps == 26.5625
    t = topology_from_dict(build(facts, Overrides()).topology, "nvml")
    assert t.intra.kind.value == "mesh" and t.intra.links_per_pair == 6 and t.gpus_per_node == 4


# ---- CLI -------------------------------------------------------------------------------------------
def test_cli_detect_writes_a_file_that_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "32")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    out = tmp_path / "t.yaml"
    assert main(["topo", "detect", "--from", str(FIX / "dgx-h100"), "-o", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    t = load_topology(str(out))
    assert t.num_nodes == 4 and t.fingerprint() == info["fingerprint"] and info["assumed"]
    assert "# assumed" in out.read_text()


def test_cli_detect_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "10")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert main(["topo", "detect", "--from", str(FIX / "dgx-h100")]) == 2
    assert capsys.readouterr().err.startswith("error: WORLD_SIZE 10")
    monkeypatch.delenv("WORLD_SIZE")
    assert main(["topo", "detect", "--from", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --from") and err.count("\n") == 1


# ---- topo show --json loads back; the examples load -----------------------------------------------
@pytest.mark.parametrize("preset", ["dgx-h100", "h200x4", "pcie-8gpu"])
def test_topo_show_json_loads_back(tmp_path, capsys, preset):
    assert main(["topo", "show", preset, "-n", "3", "--json"]) == 0
    path = tmp_path / "t.json"
    path.write_text(capsys.readouterr().out)
    t = load_topology(str(path))
    assert t == load_topology(preset, 3) and t.fingerprint() == json.loads(path.read_text())["fingerprint"]
    data = json.loads(path.read_text()) | {"world_size": 5}
    path.write_text(json.dumps(data))
    with pytest.raises(HiercollError, match="world_size"):
        load_topology(str(path))


def test_examples_load():
    from hiercoll.calibration.nccl_tests import parse_nccl_tests
    t = load_topology(str(EXAMPLES / "two_node_h100.yaml"))
    assert (t.num_nodes, t.gpus_per_node, t.world_size) == (2, 8, 16)
    assert yaml.safe_load((EXAMPLES / "two_node_h100.yaml").read_text())["name"] == "two-node-h100"
    log = EXAMPLES / "all_reduce_perf.2node.log"
    rows = parse_nccl_tests(log.read_text(), str(log))
    assert len(rows) == 16 and {r.world_size for r in rows} == {16} and {r.num_nodes for r in rows} == {2}


def test_cli_detect_record_saves_the_raw_outputs(tmp_path, capsys):
    rec = tmp_path / "raw"
    assert main(["topo", "detect", "--from", str(FIX / "h200x4"), "--record", str(rec), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["fingerprint"]
    assert sorted(p.name for p in rec.iterdir()) == sorted(p.name for p in (FIX / "h200x4").iterdir())
    assert main(["topo", "detect", "--from", str(rec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fingerprint"] == first
