"""Collective arguments of real workloads (context-parallel attention, MoE), as specs."""

from hiercoll.workloads.cp_attention import causal_kv_group_cast

__all__ = ["causal_kv_group_cast"]
