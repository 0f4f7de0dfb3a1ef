"""The swizzled hierarchical family: intra-node scatter, one RDMA crossing per byte, final reduce."""
