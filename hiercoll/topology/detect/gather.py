"""Collect one node's facts: from recorded tool outputs (a directory, for tests and for machines
you cannot run hiercoll on), or live (NVML, else `nvidia-smi`; `rocm-smi` on AMD; sysfs for NICs).

Recorded files, by name (any may be missing):
  nvidia-smi-topo-m.txt      `nvidia-smi topo -m`
  nvidia-smi-q.txt           `nvidia-smi -q`
  nvidia-smi-nvlink-s.txt    `nvidia-smi nvlink -s`
  rocm-smi-showtopo.txt      `rocm-smi --showtopo`
  rocm-smi-productname.txt   `rocm-smi --showproductname`
  sysfs.txt                  NIC files under /sys/class (sysfs.dump_sysfs's form)
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from hiercoll.errors import HiercollError
from hiercoll.topology.detect.facts import GpuFacts, NicFacts, NodeFacts
from hiercoll.topology.detect.nvidia_smi import parse_nvlink_status, parse_query, parse_topo_matrix
from hiercoll.topology.detect.nvml import read_nvml
from hiercoll.topology.detect.rocm import parse_showtopo
from hiercoll.topology.detect.sysfs import dump_sysfs, parse_sysfs_dump

COMMANDS: dict[str, list[str]] = {
    "nvidia-smi-topo-m.txt": ["nvidia-smi", "topo", "-m"],
    "nvidia-smi-q.txt": ["nvidia-smi", "-q"],
    "nvidia-smi-nvlink-s.txt": ["nvidia-smi", "nvlink", "-s"],
    "rocm-smi-showtopo.txt": ["rocm-smi", "--showtopo"],
    "rocm-smi-productname.txt": ["rocm-smi", "--showproductname"],
}
SYSFS = "sysfs.txt"


def facts_from_texts(texts: dict[str, str], where: str = "") -> NodeFacts:
    """Parse whatever outputs are present (keys: COMMANDS' file names and SYSFS)."""
    def src(name: str) -> str:
        return f"{where}/{name}" if where else name

    if "nvidia-smi-q.txt" in texts or "nvidia-smi-topo-m.txt" in texts:
        facts = NodeFacts(sources=[])
        if "nvidia-smi-q.txt" in texts:
            facts.gpus, facts.switch = parse_query(texts["nvidia-smi-q.txt"], src("nvidia-smi-q.txt"))
            facts.sources.append("nvidia-smi -q")
        _add_matrix(facts, texts, src)
        if "nvidia-smi-nvlink-s.txt" in texts:
            _add_nvlink_speeds(facts, texts["nvidia-smi-nvlink-s.txt"], src("nvidia-smi-nvlink-s.txt"))
    elif "rocm-smi-showtopo.txt" in texts:
        facts = parse_showtopo(texts["rocm-smi-showtopo.txt"], texts.get("rocm-smi-productname.txt"),
                               src("rocm-smi-showtopo.txt"))
    else:
        raise HiercollError(f"topo detect: no GPU tool output{' in ' + where if where else ''} "
                            "(nvidia-smi-q.txt, nvidia-smi-topo-m.txt or rocm-smi-showtopo.txt)")
    if SYSFS in texts:
        merge_nics(facts, parse_sysfs_dump(texts[SYSFS]))
        facts.sources.append("/sys/class")
    return facts


def _add_matrix(facts: NodeFacts, texts: dict[str, str], src: Callable[[str], str]) -> None:
    if "nvidia-smi-topo-m.txt" not in texts:
        facts.notes.append("no `nvidia-smi topo -m`: NVLink pairs and NIC placement unknown")
        return
    n, links, nics, _ = parse_topo_matrix(texts["nvidia-smi-topo-m.txt"], src("nvidia-smi-topo-m.txt"))
    if facts.gpus and len(facts.gpus) != n:
        raise HiercollError(f"{src('nvidia-smi-topo-m.txt')}: {n} GPUs, but nvidia-smi -q lists "
                            f"{len(facts.gpus)}; record both on the same machine")
    if not facts.gpus:
        facts.gpus = [GpuFacts(name="unknown GPU") for _ in range(n)]
        facts.notes.append("no `nvidia-smi -q`: GPU model unknown")
    facts.links = links
    facts.fabric = "nvlink" if links else "pcie"
    facts.nics = nics
    facts.sources.append("nvidia-smi topo -m")


def _add_nvlink_speeds(facts: NodeFacts, text: str, source: str) -> None:
    speeds = parse_nvlink_status(text, source)
    active = [v for v in speeds.values() if v]
    if active:
        facts.link_gbps = min(min(v) for v in active)
        facts.links_per_gpu = min(len(v) for v in active)
        facts.fabric = "nvlink"
        facts.sources.append("nvidia-smi nvlink -s")


def merge_nics(facts: NodeFacts, found: list[NicFacts]) -> None:
    """sysfs NICs (rates, state) joined with the matrix's NICs (PCIe distances) by name."""
    levels = {x.name: x.gpu_level for x in facts.nics}
    for nic in found:
        nic.gpu_level = levels.get(nic.name, {})
    facts.nics = found


def read_recorded(directory: Path) -> dict[str, str]:
    if not directory.is_dir():
        raise HiercollError(f"--from: {directory} is not a directory of recorded tool outputs")
    texts = {}
    for name in [*COMMANDS, SYSFS]:
        p = directory / name
        if p.is_file():
            texts[name] = p.read_text(errors="replace")
    return texts


def run_tools(timeout_s: float = 30.0) -> dict[str, str]:
    """Outputs of the tools this machine has (non-zero exits and missing tools left out)."""
    texts: dict[str, str] = {}
    for name, cmd in COMMANDS.items():
        if shutil.which(cmd[0]) is None:
            continue
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if res.returncode == 0 and res.stdout.strip():
            texts[name] = res.stdout
    sysfs = dump_sysfs()
    if sysfs:
        texts[SYSFS] = sysfs
    return texts


def detect_live(use_nvml: bool = True) -> tuple[NodeFacts, dict[str, str]]:
    """This machine's facts and the raw texts they came from. NVML first (when installed) for
    GPUs and NVLinks; `nvidia-smi topo -m` still places the NICs."""
    texts = run_tools()
    nvml = read_nvml() if use_nvml else None
    if nvml is None:
        if not any(name in texts for name in COMMANDS if name.endswith(("-q.txt", "-m.txt",
                                                                        "showtopo.txt"))):
            raise HiercollError("topo detect: no GPU found on this machine: NVML (pynvml) is not "
                                "installed or sees no GPU, and neither nvidia-smi nor rocm-smi "
                                "is on PATH; run it on a GPU node, or give --from DIR with "
                                "recorded outputs")
        return facts_from_texts(texts), texts
    if "nvidia-smi-topo-m.txt" in texts:
        _, _, nics, _ = parse_topo_matrix(texts["nvidia-smi-topo-m.txt"])
        nvml.nics = nics
        nvml.sources.append("nvidia-smi topo -m")
    if SYSFS in texts:
        merge_nics(nvml, parse_sysfs_dump(texts[SYSFS]))
        nvml.sources.append("/sys/class")
    return nvml, texts
