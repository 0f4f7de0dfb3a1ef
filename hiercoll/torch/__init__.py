"""hiercoll.torch: the torch-facing communicator (imports torch; see docs/torch.md).

Names are loaded lazily so that `hiercoll.torch.reference` (pure torch math) does not pull in the
planner and the executors.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Communicator", "Work", "patch", "unfused_add_rms_norm", "unpatch"]

_WHERE = {"Communicator": "hiercoll.torch.communicator", "Work": "hiercoll.torch.work",
          "patch": "hiercoll.torch.communicator", "unpatch": "hiercoll.torch.patching",
          "unfused_add_rms_norm": "hiercoll.torch.reference"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'hiercoll.torch' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(_WHERE[name]), name)
