"""Triton kernels (import triton only when a kernel module is imported)."""
