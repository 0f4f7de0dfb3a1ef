"""Backend lookup by name; each backend module (and torch) is imported only when asked for."""

from __future__ import annotations

import importlib

from hiercoll.errors import HiercollError
from hiercoll.executor.interface import Backend, BackendName

_MODULES = {
    BackendName.GLOO: ("hiercoll.executor.gloo", "GlooBackend"),
    BackendName.NCCL: ("hiercoll.executor.library", "LibraryBackend"),
    BackendName.CUDA: ("hiercoll.executor.cuda.backend", "CudaBackend"),
}

DISTRIBUTED = tuple(_MODULES)


def parse_backend(name: str) -> BackendName:
    try:
        return BackendName(name)
    except ValueError:
        raise HiercollError(f"--backend: unknown {name!r}; choose one of "
                            f"{', '.join(b.value for b in DISTRIBUTED)}") from None


def get_backend(name: str | BackendName, **options: object) -> Backend:
    """A backend instance; `options` go to its constructor (cuda: CudaOptions fields)."""
    key = parse_backend(str(name))
    if key not in _MODULES:
        raise HiercollError(f"--backend {key}: runs in one process; use `hiercoll verify`")
    try:
        module = importlib.import_module(_MODULES[key][0])
    except ImportError as exc:
        extra = "cuda" if key == BackendName.CUDA or exc.name == "triton" else "torch"
        raise HiercollError(f"--backend {key}: needs {exc.name}, which is not installed: pip "
                            f"install 'hiercoll[{extra}]'") from None
    return getattr(module, _MODULES[key][1])(**options)
