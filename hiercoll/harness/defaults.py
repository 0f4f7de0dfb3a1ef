"""Timing defaults and peer names the CLI shows in its help: torch-free, so `hiercoll --help`
and the CPU-only commands never import torch."""

GRAPH_CALLS = 10     # calls per captured graph, timed per call (nccl-tests' CUDA-graph mode)
EAGER_CALLS = 10     # eager calls per timed batch (events around each call would cost the host)
PEERS = ("nccl", "torch-one-shot", "torch-two-shot", "torch-reduce-scatter")   # harness.peers
