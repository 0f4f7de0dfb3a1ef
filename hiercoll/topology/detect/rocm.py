"""Parser for `rocm-smi --showtopo` (AMD): GPU count and the link type of each GPU pair (XGMI or
PCIE), with `--showproductname`'s card series for the GPU name when given."""

from __future__ import annotations

import re

from hiercoll.errors import HiercollError
from hiercoll.topology.detect.facts import GpuFacts, NodeFacts

_SECTION = re.compile(r"^=+\s*(.*?)\s*=+$")


def parse_showtopo(text: str, product_text: str | None = None,
                   source: str = "rocm-smi --showtopo") -> NodeFacts:
    matrix: dict[str, list[str]] = {}
    header: list[str] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if (m := _SECTION.match(line)) is not None:
            section = m.group(1).lower()
            continue
        if not section.startswith("link type"):
            continue
        toks = line.split()
        if toks and all(re.fullmatch(r"GPU\d+", t) for t in toks):
            header = toks
        elif header and toks and toks[0] in header:
            matrix[toks[0]] = toks[1:len(header) + 1]
    if not header or any(g not in matrix for g in header):
        raise HiercollError(f"{source}: no complete 'Link Type between two GPUs' matrix; "
                            "record the whole `rocm-smi --showtopo` output")
    n = len(header)
    types = {(i, j): matrix[header[i]][j].upper() for i in range(n) for j in range(n) if i < j}
    name = _product(product_text) or "AMD GPU"
    facts = NodeFacts(gpus=[GpuFacts(name=name) for _ in range(n)], sources=["rocm-smi --showtopo"])
    if n > 1 and all(t == "XGMI" for t in types.values()):
        facts.fabric = "xgmi"
        facts.links = {k: 1 for k in types}
    else:
        facts.fabric = "pcie"
        if any(t == "XGMI" for t in types.values()):
            facts.notes.append("only some GPU pairs have xGMI links; modelled as PCIe")
    return facts


def _product(text: str | None) -> str | None:
    for line in (text or "").splitlines():
        m = re.search(r"Card (?:series|Series)\s*:\s*(.+?)\s*$", line)
        if m:
            return m.group(1)
    return None
