"""`hiercoll topo detect`: one node's topology from its tools (NVML / nvidia-smi, sysfs NICs,
rocm-smi), parsed by pure functions over their text so recorded outputs are test fixtures."""

from hiercoll.topology.detect.build import Detected, Overrides, build
from hiercoll.topology.detect.facts import GpuFacts, NicFacts, NodeFacts
from hiercoll.topology.detect.gather import detect_live, facts_from_texts, read_recorded

__all__ = ["Detected", "GpuFacts", "NicFacts", "NodeFacts", "Overrides", "build", "detect_live",
           "facts_from_texts", "read_recorded"]
