"""Parsers for `nvidia-smi` text: `topo -m` (GPU/NIC matrix), `-q` (per-GPU details) and
`nvlink -s` (per-link speeds). Pure functions over the text, so recorded outputs test them.

`topo -m` cells: `X` self, `NV<k>` k bonded NVLinks, else the PCIe distance (PIX, PXB, PHB, NODE,
SYS). NIC rows/columns are named `NIC<i>` with a `NIC Legend` mapping them to device names
(recent drivers) or by the device name itself (older ones)."""

from __future__ import annotations

import re

from hiercoll.errors import HiercollError
from hiercoll.topology.detect.facts import PCIE_LEVELS, GpuFacts, NicFacts, normalize_pci

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NV = re.compile(r"^NV(\d+)$")
_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+|[a-z]+\d*_\d+)$")
_LEGEND_NIC = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


def parse_topo_matrix(text: str, source: str = "nvidia-smi topo -m"
                      ) -> tuple[int, dict[tuple[int, int], int], list[NicFacts], dict[tuple[int, int], str]]:
    """GPU count, NVLinks per GPU pair (i < j), NICs with their PCIe level to each GPU, and the
    non-NVLink level of each GPU pair."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    # the header is indented (rows start at column 0 with their device name)
    header_at = next((i for i, ln in enumerate(lines) if ln[:1].isspace() and "GPU0" in ln.split()), None)
    if header_at is None:
        raise HiercollError(f"{source}: no matrix header (a line naming GPU0, GPU1, ... columns); "
                            "is this `nvidia-smi topo -m` output?")
    columns = []
    for tok in lines[header_at].split():
        if not _DEVICE.match(tok):
            break
        columns.append(tok)
    legend = {m.group(1): m.group(2) for ln in lines if (m := _LEGEND_NIC.match(ln))}
    rows: dict[str, list[str]] = {}
    for ln in lines[header_at + 1:]:
        toks = ln.split()
        if not toks:
            if rows:
                break
            continue
        if toks[0] in columns and len(toks) >= len(columns) + 1:
            rows[toks[0]] = toks[1:len(columns) + 1]
    gpus = [c for c in columns if c.startswith("GPU")]
    if not gpus or any(g not in rows for g in gpus):
        raise HiercollError(f"{source}: the matrix has no row for every GPU column "
                            f"({', '.join(gpus) or 'none'}); record the whole output")
    links: dict[tuple[int, int], int] = {}
    levels: dict[tuple[int, int], str] = {}
    for i, g in enumerate(gpus):
        for j, h in enumerate(gpus):
            if j <= i:
                continue
            cell = rows[g][columns.index(h)]
            if (m := _NV.match(cell)) is not None:
                links[(i, j)] = int(m.group(1))
            else:
                levels[(i, j)] = cell
    nics = []
    for col in columns:
        if col.startswith("GPU"):
            continue
        level = {i: rows[g][columns.index(col)] for i, g in enumerate(gpus)}
        nics.append(NicFacts(name=legend.get(col, col),
                             gpu_level={i: v for i, v in level.items() if v in PCIE_LEVELS}))
    return len(gpus), links, nics, levels


def parse_query(text: str, source: str = "nvidia-smi -q") -> tuple[list[GpuFacts], bool | None]:
    """GPUs (name, memory, bus id, PCIe generation/width) from `nvidia-smi -q`, and whether an
    NVLink fabric (NVSwitch + fabric manager) reports itself: the `Fabric` section's `State`
    is `Completed` on NVSwitch systems and `N/A` elsewhere (None when the section is absent)."""
    gpus: list[GpuFacts] = []
    section: list[str] = []
    fabric: bool | None = None
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        if (m := re.match(r"^GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])\s*$", line)):
            gpus.append(GpuFacts(name="", pci=normalize_pci(m.group(1))))
            section = []
            continue
        if not gpus or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        key, value = key.strip(), value.strip()
        depth = max(0, (indent - 4) // 4)
        section = section[:depth]
        if not sep or not value:
            section.append(key)
            continue
        gpu = gpus[-1]
        where = tuple(section)
        if key == "Product Name":
            gpu.name = value
        elif key == "Total" and where[-1:] == ("FB Memory Usage",):
            gpu.memory_mib = _int_prefix(value)
        elif key == "Max" and where[-1:] == ("PCIe Generation",):
            gpu.pcie_gen = _int_prefix(value)
        elif key == "Max" and where[-1:] == ("Link Width",):
            gpu.pcie_width = _int_prefix(value)
        elif key == "State" and where[-1:] == ("Fabric",):
            fabric = (fabric or False) or value.lower() in ("completed", "success")
    if not gpus or any(not g.name for g in gpus):
        raise HiercollError(f"{source}: no 'GPU <bus id>' sections with a 'Product Name'; "
                            "is this `nvidia-smi -q` output?")
    return gpus, fabric


def parse_nvlink_status(text: str, source: str = "nvidia-smi nvlink -s") -> dict[int, list[float]]:
    """Per GPU, the speed (GB/s per direction) of each active NVLink; inactive links left out."""
    out: dict[int, list[float]] = {}
    current: int | None = None
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).strip()
        if (m := re.match(r"^GPU\s+(\d+):", line)):
            current = int(m.group(1))
            out[current] = []
        elif current is not None and (m := re.match(r"^Link\s+\d+:\s*([0-9.]+)\s*GB/s", line)):
            out[current].append(float(m.group(1)))
    if not out:
        raise HiercollError(f"{source}: no 'GPU <i>:' lines; is this `nvidia-smi nvlink -s` output?")
    return out


def _int_prefix(value: str) -> int | None:
    m = re.match(r"\s*(\d+)", value)
    return int(m.group(1)) if m else None
