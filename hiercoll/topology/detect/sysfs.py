"""NICs from sysfs: `/sys/class/infiniband` (RDMA devices: rate, state, link layer, PCI address,
NUMA node), else `/sys/class/net` (Ethernet speed) for boxes without RDMA.

Both the live reader and the tests go through one text form, `path: value` lines relative to
/sys/class (what `grep -H . FILES` prints), so a recorded dump of a machine is a fixture:

    infiniband/mlx5_0/ports/1/rate: 400 Gb/sec (4X NDR)
    infiniband/mlx5_0/ports/1/state: 4: ACTIVE
    infiniband/mlx5_0/ports/1/link_layer: InfiniBand
    infiniband/mlx5_0/device: 0000:18:00.0          (the PCI address the symlink points at)
    infiniband/mlx5_0/device/numa_node: 0
    net/eth0/speed: 100000                           (Mb/s)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hiercoll.topology.detect.facts import NicFacts, normalize_pci

_PCI = re.compile(r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F])$")
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")
# Interfaces that are never a NIC that collectives use.
_VIRTUAL_NET = re.compile(r"^(lo|docker\d*|veth.*|virbr.*|br-.*|cni.*|flannel.*|tun.*|tap.*|ib\d+.*)$")


def parse_sysfs_dump(text: str) -> list[NicFacts]:
    """RDMA devices (one per device, its first port with a rate) when any are listed, else
    physical Ethernet interfaces with a speed. Rates are per direction in 1e9 B/s."""
    ib: dict[str, dict[str, str]] = {}
    net: dict[str, dict[str, str]] = {}
    for raw in text.splitlines():
        path, sep, value = raw.partition(": ")
        if not sep:
            path, sep, value = raw.partition(":")
        parts = path.strip().split("/")
        if len(parts) < 3:
            continue
        value = value.strip()
        if parts[0] == "infiniband":
            dev = ib.setdefault(parts[1], {})
            if parts[2] == "ports" and len(parts) == 5:
                dev.setdefault(f"port{parts[3]}.{parts[4]}", value)
            elif parts[2:] == ["device"]:
                dev["pci"] = value
            elif parts[2:] == ["device", "numa_node"]:
                dev["numa"] = value
        elif parts[0] == "net" and not _VIRTUAL_NET.match(parts[1]):
            dev = net.setdefault(parts[1], {})
            key = "/".join(parts[2:])
            dev[{"device": "pci", "device/numa_node": "numa"}.get(key, key)] = value
    if ib:
        return [_ib_nic(name, fields) for name, fields in sorted(ib.items())]
    return [_net_nic(name, fields) for name, fields in sorted(net.items()) if "pci" in fields]


def _ib_nic(name: str, fields: dict[str, str]) -> NicFacts:
    ports = sorted({k.split(".")[0] for k in fields if k.startswith("port")})
    port = next((p for p in ports if "ACTIVE" in fields.get(f"{p}.state", "")), ports[0] if ports else "")
    rate = _RATE.match(fields.get(f"{port}.rate", ""))
    return NicFacts(name=name, gbps=float(rate.group(1)) / 8 if rate else None,
                    active="ACTIVE" in fields.get(f"{port}.state", ""),
                    link_layer=fields.get(f"{port}.link_layer") or None,
                    pci=_pci(fields.get("pci")), numa=_numa(fields.get("numa")))


def _net_nic(name: str, fields: dict[str, str]) -> NicFacts:
    speed = fields.get("speed", "")
    mbps = int(speed) if speed.lstrip("-").isdigit() else -1
    return NicFacts(name=name, gbps=mbps / 8000 if mbps > 0 else None,
                    active=fields.get("operstate", "up") == "up" and mbps > 0,
                    link_layer="Ethernet", pci=_pci(fields.get("pci")), numa=_numa(fields.get("numa")))


def _pci(value: str | None) -> str | None:
    m = _PCI.search(value or "")
    return normalize_pci(m.group(1)) if m else None


def _numa(value: str | None) -> int | None:
    return int(value) if value and value.lstrip("-").isdigit() and int(value) >= 0 else None


def dump_sysfs(root: Path = Path("/sys/class")) -> str:
    """This machine's NIC files in the `path: value` form `parse_sysfs_dump` reads."""
    out: list[str] = []

    def add(rel: str, path: Path, link: bool = False) -> None:
        try:
            value = os.path.realpath(path) if link else path.read_text().strip()
        except OSError:
            return
        if link and not path.exists():
            return
        out.append(f"{rel}: {value}")

    for cls, per_dev in (("infiniband", ("device", "device/numa_node")),
                         ("net", ("device", "device/numa_node", "speed", "operstate"))):
        base = root / cls
        try:
            devices = sorted(p.name for p in base.iterdir())
        except OSError:
            continue
        for dev in devices:
            if cls == "infiniband":
                ports = base / dev / "ports"
                for port in sorted(p.name for p in ports.iterdir()) if ports.is_dir() else []:
                    for f in ("rate", "state", "link_layer"):
                        add(f"infiniband/{dev}/ports/{port}/{f}", ports / port / f)
            for f in per_dev:
                add(f"{cls}/{dev}/{f}", base / dev / f, link=f == "device")
    return "\n".join(out) + ("\n" if out else "")
