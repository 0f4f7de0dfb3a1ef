"""Exports to other tools: an NCCL tuner-plugin config from a tuning.json (`nccl_tuner`), and
Chakra execution traces of a plan for ASTRA-sim (`chakra`)."""
