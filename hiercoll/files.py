"""Writing outputs: a temp file in the target's directory, then a rename, so a reader never sees
a half-written plan, trace, result or plot."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write to a temp file in the same directory, then rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> None:
    """A matplotlib figure as a PNG, written atomically like every other output."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    write_atomic(path, buf.getvalue())
