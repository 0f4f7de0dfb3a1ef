"""Cluster topology: models, presets, loading."""

from hiercoll.topology.load import load_topology
from hiercoll.topology.model import Costs, Gpu, InterFabric, IntraFabric, IntraKind, Topology
from hiercoll.topology.presets import preset, preset_names

__all__ = ["Costs", "Gpu", "InterFabric", "IntraFabric", "IntraKind", "Topology", "load_topology",
           "preset", "preset_names"]
