"""GPUs and NVLinks through NVML (`pip install nvidia-ml-py`, imported as `pynvml`), imported
only when called: hiercoll does not need it, and without it `nvidia-smi` text is parsed instead.

Per GPU: name, memory, bus id; per active NVLink: its version (hence its speed) and what is at
the other end: a peer GPU (by bus id) or an NVSwitch."""

from __future__ import annotations

from typing import Any

from hiercoll.topology.detect.facts import GpuFacts, NodeFacts, normalize_pci

# GB/s per link per direction by NVLink version (NVML's nvmlDeviceGetNvLinkVersion).
NVLINK_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 26.5625, 5: 50.0}
_SWITCH_TYPE = 2            # NVML_NVLINK_DEVICE_TYPE_SWITCH
_MAX_LINKS = 18             # NVML_NVLINK_MAX_LINKS


def read_nvml(nvml: Any = None) -> NodeFacts | None:
    """NodeFacts from NVML, or None when pynvml is not installed or NVML does not start.
    `nvml` replaces the module (tests pass a fake)."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
    except Exception:   # NVMLError_LibraryNotFound, DriverNotLoaded, ...: fall back to nvidia-smi
        return None
    try:
        return _collect(nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _collect(nvml: Any) -> NodeFacts:
    facts = NodeFacts(fabric=None, sources=["NVML"])
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    bus_of = []
    for h in handles:
        bus = normalize_pci(_text(nvml.nvmlDeviceGetPciInfo(h).busId))
        bus_of.append(bus)
        g = GpuFacts(name=_text(nvml.nvmlDeviceGetName(h)),
                     memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(h).total) // (1 << 20), pci=bus)
        try:
            g.pcie_gen = int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h))
            g.pcie_width = int(nvml.nvmlDeviceGetMaxPcieLinkWidth(h))
        except Exception:
            pass
        facts.gpus.append(g)
    speeds: list[float] = []
    per_gpu: list[int] = []
    switch_seen = False
    for i, h in enumerate(handles):
        active = 0
        for link in range(_MAX_LINKS):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(h, link):
                    continue
            except Exception:      # NOT_SUPPORTED: no such link (or no NVLink at all)
                continue
            active += 1
            try:
                speeds.append(NVLINK_GBPS.get(int(nvml.nvmlDeviceGetNvLinkVersion(h, link)), 0.0))
            except Exception:
                pass
            try:
                if int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)) == _SWITCH_TYPE:
                    switch_seen = True
                    continue
            except Exception:
                pass
            try:
                peer = normalize_pci(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
            except Exception:
                continue
            if peer in bus_of:
                j = bus_of.index(peer)
                if j > i:
                    facts.links[(i, j)] = facts.links.get((i, j), 0) + 1
            else:
                switch_seen = True     # the far end is no GPU of ours: a switch
        per_gpu.append(active)
    if any(per_gpu):
        facts.fabric = "nvlink"
        facts.switch = switch_seen
        facts.links_per_gpu = min(per_gpu)
        good = [s for s in speeds if s > 0]
        facts.link_gbps = min(good) if good else None
    else:
        facts.fabric = "pcie"
    return facts
