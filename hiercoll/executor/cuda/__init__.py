"""The cuda backend: lowering (pure Python, tested on CPU) and the torch/Triton runtime."""
