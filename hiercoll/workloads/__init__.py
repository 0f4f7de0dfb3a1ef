"""Model-level front ends whose output is a hiercoll plan: context-parallel attention
(llama3-style all-gather KV for varlen batches, MagiAttention-style mask dispatch with
zero-redundancy group-cast), MoE dispatch/combine, and the fixed-length causal helper."""

from hiercoll.workloads import attention, llama3_cp, moe
from hiercoll.workloads.cp_attention import causal_kv_group_cast

__all__ = ["attention", "causal_kv_group_cast", "llama3_cp", "moe"]
