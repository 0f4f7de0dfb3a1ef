"""Switch layout of a tiered scale-out fabric: how many switches, ports and nodes each tier has.

Below both the topology model (whose validator refuses layouts the tiers cannot build) and the
fabric's routing (`fabric.py`): it reads the tier fields through a protocol, so it imports
neither of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class TierFields(Protocol):
    """What the layout reads of one `inter.tiers` entry (topology.model.FabricTier)."""

    @property
    def name(self) -> str: ...
    @property
    def group_size(self) -> int | None: ...
    @property
    def uplinks(self) -> int | None: ...
    @property
    def uplink_gbps(self) -> float | None: ...
    @property
    def oversubscription(self) -> float | None: ...
    @property
    def latency_us(self) -> float: ...
    @property
    def radix(self) -> int | None: ...
    @property
    def rails(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class TierLayout:
    index: int
    name: str
    span: int            # nodes under one group of this tier
    groups: int          # groups of this tier (the last one may be partial)
    switches: int        # switches in one group
    down_ports: int      # per switch: toward the NICs (leaf) or the tier below
    uplinks: int         # per switch: toward the tier above (0 on the outermost)
    port_gbps: float     # per uplink port per direction (0 on the outermost)
    latency_us: float
    rails: bool

    @property
    def group_uplink_gbps(self) -> float:
        """What one group can send out of itself at once (all its switches' uplinks)."""
        return self.switches * self.uplinks * self.port_gbps


def tier_layouts(tiers: Sequence[TierFields], num_nodes: int, num_nics: int,
                 nic_gbps: float) -> list[TierLayout]:
    """Every tier's layout. Values only: `check_tier_layouts` says what is wrong."""
    n = num_nodes
    out: list[TierLayout] = []
    last = len(tiers) - 1
    for i, tier in enumerate(tiers):
        below = out[-1] if out else None
        size = tier.group_size
        if size is None:                       # the outermost tier: everything
            size = n if below is None else math.ceil(n / below.span)
        span = size if below is None else below.span * size
        if below is None:
            switches = num_nics if tier.rails else 1
            down = size * (1 if tier.rails else num_nics)
            down_gbps = down * nic_gbps
        else:
            switches = below.switches * below.uplinks if below.index > 0 else below.uplinks
            down = size * (below.switches if below.index == 0 else 1)
            down_gbps = down * below.port_gbps
        uplinks = 0 if i == last else (tier.uplinks or 1)
        if i == last:
            port = 0.0
        elif tier.uplink_gbps is not None:
            port = tier.uplink_gbps
        else:
            port = down_gbps / (tier.oversubscription or 1.0) / uplinks
        out.append(TierLayout(i, tier.name, span, math.ceil(n / span), switches, down, uplinks,
                              port, tier.latency_us, tier.rails))
    return out


def check_tier_layouts(tiers: Sequence[TierFields], num_nodes: int, num_nics: int,
                       nic_gbps: float) -> None:
    """Raise ValueError (one line) when the tiers cannot join the topology's nodes."""
    lay = tier_layouts(tiers, num_nodes, num_nics, nic_gbps)
    top = lay[-1]
    if top.groups > 1:
        raise ValueError(f"inter.tiers[{top.index}] ({top.name}).group_size: joins "
                         f"{top.span} of {num_nodes} nodes; the outermost tier must join every "
                         "node (raise group_size or leave it out)")
    for tl, tier in zip(lay, tiers, strict=True):
        need = tl.down_ports + tl.uplinks
        if tier.radix is not None and need > tier.radix:
            raise ValueError(f"inter.tiers[{tl.index}] ({tl.name}).radix: a switch needs "
                             f"{tl.down_ports} down + {tl.uplinks} up = {need} ports, above its "
                             f"radix {tier.radix}; use fewer nodes, a smaller group_size or "
                             "fewer uplinks")
