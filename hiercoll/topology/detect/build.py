"""Detected facts -> a topology file's contents, naming every value the tools could not see.

Bandwidths follow the presets: NVLink at the measured efficiency (`presets.NVLINK_EFFICIENCY`),
NICs at `presets.NIC_EFFICIENCY` of line rate, xGMI at 0.8. What no tool reports (latencies,
HBM bandwidth and SM count of an unknown GPU, the fabric's oversubscription, the GPU<->NIC PCIe
path) is taken from a flag when given, else from the presets' values for that kind of node and
listed in `assumed` so the file says what it guessed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hiercoll.errors import HiercollError
from hiercoll.topology.detect.facts import PCIE_LEVELS, NicFacts, NodeFacts
from hiercoll.topology.presets import NIC_EFFICIENCY, NVLINK_EFFICIENCY

XGMI_LINK_GBPS = 64.0          # MI300X xGMI, one link per peer, per direction (as the preset)
XGMI_EFFICIENCY = 0.8
# NVLinks one GPU has, by model: more bonded links to peers than this means a switch between them.
NVLINKS_PER_GPU = {"H100": 18, "H200": 18, "H20": 18, "B200": 18, "GB200": 18, "A100": 12,
                   "A800": 8, "V100": 6}
# name fragment -> (display name, HBM GB/s, SMs); longest fragment first when matching.
GPU_SPECS: dict[str, tuple[str, float, int]] = {
    "H200": ("H200", 4800.0, 132),
    "H100 PCIe": ("H100-PCIe", 2000.0, 114),
    "H100 NVL": ("H100-NVL", 3900.0, 132),
    "H100": ("H100", 3350.0, 132),
    "GH200": ("GH200", 4000.0, 132),
    "B200": ("B200", 8000.0, 148),
    "A100-SXM4-80GB": ("A100-80G", 2039.0, 108),
    "A100": ("A100", 1555.0, 108),
    "L40S": ("L40S", 864.0, 142),
    "L40": ("L40", 864.0, 142),
    "MI300X": ("MI300X", 5300.0, 304),
    "MI250X": ("MI250X", 3277.0, 220),
}
PCIE_LANE_GBPS = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}   # per lane per direction
LATENCY_US = {"nvswitch": 1.0, "mesh": 1.5, "pcie": 3.0}    # the presets' values
INTER_LATENCY_US = 3.0


@dataclass
class Overrides:
    """What a flag gives for values no tool reports (None: assume and say so)."""

    nodes: int = 1
    hbm_gbps: float | None = None
    num_sms: int | None = None
    intra_latency_us: float | None = None
    inter_latency_us: float | None = None
    nic_gbps: float | None = None
    num_nics: int | None = None
    oversubscription: float | None = None
    name: str | None = None


@dataclass
class Detected:
    topology: dict[str, Any]
    assumed: list[str] = field(default_factory=list)    # "field = value (flag to set it)"
    seen: list[str] = field(default_factory=list)       # what the tools reported


def gpu_spec(name: str) -> tuple[str, float, int] | None:
    for frag in sorted(GPU_SPECS, key=len, reverse=True):
        if frag.lower() in name.lower():
            return GPU_SPECS[frag]
    return None


def build(facts: NodeFacts, o: Overrides) -> Detected:
    if not facts.gpus:
        raise HiercollError("topo detect: no GPU found by " + (", ".join(facts.sources) or "any tool"))
    names = Counter(g.name for g in facts.gpus)
    if len(names) > 1:
        raise HiercollError(f"topo detect: GPUs of different models on this node ({dict(names)}); "
                            "hiercoll models one GPU type per node: write the file by hand")
    name = facts.gpus[0].name
    n = len(facts.gpus)
    d = Detected(topology={})
    d.seen.append(f"{n} x {name} (from {', '.join(facts.sources)})")
    gpu = _gpu(facts, name, o, d)
    intra = _intra(facts, name, o, d)
    topo: dict[str, Any] = {"name": o.name or f"detected-{gpu['name'].lower()}x{n}",
                            "num_nodes": o.nodes, "gpus_per_node": n, "gpu": gpu, "intra": intra}
    inter = _inter(facts, n, o, d)
    if inter is not None:
        topo["inter"] = inter
    d.topology = topo
    d.seen += facts.notes
    return d


def _gpu(facts: NodeFacts, name: str, o: Overrides, d: Detected) -> dict[str, Any]:
    spec = gpu_spec(name)
    short = spec[0] if spec else name.removeprefix("NVIDIA ").replace(" ", "-")
    if o.hbm_gbps is None and spec is None:
        raise HiercollError(f"--hbm-gbps: GPU {name!r} is not in hiercoll's table; give its HBM "
                            "bandwidth (GB/s, read+write) and --num-sms")
    if o.num_sms is None and spec is None:
        raise HiercollError(f"--num-sms: GPU {name!r} is not in hiercoll's table; give its SM "
                            "(CU) count")
    hbm = o.hbm_gbps if o.hbm_gbps is not None else spec[1] if spec else 0.0
    sms = o.num_sms if o.num_sms is not None else spec[2] if spec else 0
    if o.hbm_gbps is None:
        d.assumed.append(f"gpu.hbm_gbps = {hbm:g} (datasheet value for {short}; --hbm-gbps)")
    if o.num_sms is None:
        d.assumed.append(f"gpu.num_sms = {sms} (datasheet value for {short}; --num-sms)")
    out: dict[str, Any] = {"name": short, "hbm_gbps": hbm, "num_sms": sms}
    mem = facts.gpus[0].memory_mib
    if mem:
        out["memory_gib"] = round(mem / 1024, 1)
    return out


def _intra(facts: NodeFacts, name: str, o: Overrides, d: Detected) -> dict[str, Any]:
    n = len(facts.gpus)
    kind, out = "pcie", {}
    if facts.fabric == "xgmi":
        links = min(facts.links.values(), default=1)
        kind = "mesh"
        out = {"gbps": round(XGMI_LINK_GBPS * XGMI_EFFICIENCY, 1), "links_per_pair": links}
        d.seen.append(f"xGMI between every GPU pair ({links} link(s) per pair)")
        d.assumed.append(f"intra.gbps = {out['gbps']} (xGMI {XGMI_LINK_GBPS:g} GB/s per link x "
                         f"{XGMI_EFFICIENCY}; rocm-smi gives no link speed)")
    elif facts.fabric == "nvlink" and (facts.links or facts.switch):
        per_gpu = _links_per_gpu(facts, n)
        link = facts.link_gbps
        if link is None:
            link = 26.5625
            d.assumed.append("NVLink speed 26.5625 GB/s per link (NVLink 4; no `nvidia-smi "
                             "nvlink -s` / NVML speed seen)")
        spec = gpu_spec(name)
        total = NVLINKS_PER_GPU.get(spec[0] if spec else "", 18)
        switch = facts.switch
        if switch is None:
            # more bonded links to peers than a GPU has: they go through a switch
            switch = n > 2 and per_gpu > total
            d.seen.append(f"NVSwitch {'inferred' if switch else 'not inferred'}: "
                          f"{per_gpu} NVLinks to peers per GPU, a {name} has {total}")
        else:
            d.seen.append("NVSwitch fabric reported" if switch else "no NVSwitch fabric reported")
        if switch:
            port_links = facts.links_per_gpu or (max(facts.links.values()) if facts.links else total)
            kind = "nvswitch"
            out = {"gbps": round(port_links * link * NVLINK_EFFICIENCY, 1)}
            d.seen.append(f"{port_links} NVLinks x {link:g} GB/s per GPU into the switch")
        else:
            pairs = [facts.links.get((i, j), 0) for i in range(n) for j in range(i + 1, n)]
            if min(pairs) == 0:
                d.seen.append("NVLink does not join every GPU pair; modelled as PCIe")
            else:
                kind = "mesh"
                out = {"gbps": round(link * NVLINK_EFFICIENCY, 2), "links_per_pair": min(pairs)}
                d.seen.append(f"direct NVLink mesh, {min(pairs)} link(s) x {link:g} GB/s per pair"
                              + ("" if min(pairs) == max(pairs) else
                                 f" (pairs have {min(pairs)}..{max(pairs)}; the least is used)"))
        if kind != "pcie":
            d.assumed.append(f"intra.gbps = {out['gbps']} (nominal x {NVLINK_EFFICIENCY:.3f}, the "
                             "efficiency measured on H200; calibrate to replace)")
    if kind == "pcie":
        g = facts.gpus[0]
        gen, width = g.pcie_gen or 4, g.pcie_width or 16
        gbps = round(PCIE_LANE_GBPS.get(gen, 1.969) * width, 1)
        out = {"gbps": gbps, "bridge_gbps": 2 * gbps}
        if g.pcie_gen is None or g.pcie_width is None:
            d.assumed.append(f"PCIe Gen{gen} x{width} per GPU (not reported)")
        d.assumed.append(f"intra.bridge_gbps = {2 * gbps:g} (two GPUs' worth through the host "
                         "bridge, as the pcie preset)")
    latency = o.intra_latency_us if o.intra_latency_us is not None else LATENCY_US[kind]
    if o.intra_latency_us is None:
        d.assumed.append(f"intra.latency_us = {latency:g} (preset value for {kind}; --intra-latency-us)")
    return {"kind": kind, **out, "latency_us": latency}


def _links_per_gpu(facts: NodeFacts, n: int) -> int:
    if facts.links_per_gpu is not None and not facts.links:
        return facts.links_per_gpu
    return max((sum(v for k, v in facts.links.items() if i in k) for i in range(n)), default=0)


def _inter(facts: NodeFacts, n: int, o: Overrides, d: Detected) -> dict[str, Any] | None:
    nics = compute_nics(facts.nics)
    for nic in facts.nics:
        if nic not in nics:
            d.seen.append(f"NIC {nic.name} left out (" + ("inactive" if not nic.active else
                          "no PCIe switch shared with a GPU" if nic.gbps else "no rate") + ")")
    if o.num_nics is not None:
        nics = nics[:o.num_nics]
    num = o.num_nics or len(nics)
    rates = [x.gbps for x in nics if x.gbps]
    if not num or (not rates and o.nic_gbps is None):
        if o.nodes > 1:
            raise HiercollError("--nic-gbps: no active NIC with a rate was found "
                                "(/sys/class/infiniband, /sys/class/net); give --num-nics and "
                                "--nic-gbps (per NIC, GB/s per direction) for a multi-node file")
        d.seen.append("no NIC used (one node)")
        return None
    line = min(rates) if rates else 0.0
    gbps = o.nic_gbps if o.nic_gbps is not None else round(line * NIC_EFFICIENCY, 2)
    if rates:
        d.seen.append(f"{len(nics)} NIC(s): {', '.join(x.name for x in nics)} at {line:g} GB/s line rate")
    if o.nic_gbps is None:
        d.assumed.append(f"inter.nic_gbps = {gbps:g} (line rate x {NIC_EFFICIENCY}; --nic-gbps)")
    if num > n:     # the model sends each GPU through one NIC: NICs beyond one per GPU add rate
        gbps = round(gbps * num / n, 2)
        d.assumed.append(f"{num} NICs for {n} GPUs: one NIC per GPU at {num / n:g}x a NIC's rate "
                         "(a GPU sends through one NIC in hiercoll's model)")
        num, nics = n, []
    out: dict[str, Any] = {"num_nics": num, "nic_gbps": gbps}
    latency = o.inter_latency_us if o.inter_latency_us is not None else INTER_LATENCY_US
    out["latency_us"] = latency
    if o.inter_latency_us is None:
        d.assumed.append(f"inter.latency_us = {latency:g} (preset value; --inter-latency-us)")
    affinity = nic_affinity(nics, n) if len(nics) == num else None
    if affinity is not None:
        out["nic_affinity"] = affinity
        d.seen.append(f"rails: NIC i nearest to local rank {affinity}")
    else:
        d.assumed.append("inter.nic_affinity = spread evenly (no NIC-GPU PCIe distances seen)")
    if o.oversubscription is not None:
        out["oversubscription"] = o.oversubscription
    else:
        d.assumed.append("inter.oversubscription = 1 (non-blocking; --oversubscription)")
    d.assumed.append("inter.gpu_nic_gbps = 2 x nic_gbps (default; edit the file to set it)")
    return out


def compute_nics(nics: list[NicFacts]) -> list[NicFacts]:
    """The NICs collectives use: active ones with a rate; where PCIe distances to GPUs are known,
    only those sharing a PCIe switch with a GPU (PIX/PXB: storage and management NICs hang off
    the CPU); then only the fastest rate (a slower side NIC is not a rail)."""
    usable = [x for x in nics if x.active and x.gbps]
    near = [x for x in usable if any(v in ("PIX", "PXB") for v in x.gpu_level.values())]
    if near:
        usable = near
    top = max((x.gbps or 0.0 for x in usable), default=0.0)
    return [x for x in usable if x.gbps == top]


def nic_affinity(nics: list[NicFacts], n: int) -> list[int] | None:
    """For each NIC, the nearest GPU by PCIe distance; ties go to the lowest GPU no NIC has taken
    yet. None when a NIC has no distances."""
    if not nics or any(not x.gpu_level for x in nics):
        return None
    taken: set[int] = set()
    out = []
    for x in nics:
        best = min(PCIE_LEVELS.index(v) for v in x.gpu_level.values())
        cands = sorted(g for g, v in x.gpu_level.items() if PCIE_LEVELS.index(v) == best)
        pick = next((g for g in cands if g not in taken), cands[0])
        taken.add(pick)
        out.append(pick)
    return out if all(0 <= a < n for a in out) else None


def to_yaml(d: Detected, header: list[str]) -> str:
    """The topology as YAML, headed by comments: where it came from, what was seen, what was
    assumed (so a reader knows which numbers to check)."""
    import yaml
    lines = [f"# {h}" for h in header]
    lines += ["# seen:"] + [f"#   {s}" for s in d.seen]
    lines += ["# assumed (no tool reports these; set them with the flag named or edit here):"]
    lines += [f"#   {a}" for a in d.assumed]
    return "\n".join(lines) + "\n" + str(yaml.safe_dump(d.topology, sort_keys=False))
