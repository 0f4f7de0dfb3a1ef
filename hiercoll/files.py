"""Writing outputs, with errors that name the path.

Outputs go to a temp file beside the file they replace, then a rename, so a reader never sees a
half-written plan, trace, result or plot. `-o PATH` writes *to* PATH: a symlink is followed (its
target is replaced, the link stays), and anything that is not a regular file (a directory, a
device, a FIFO) is refused rather than replaced. Problems are OSErrors whose filename is the path
given and whose strerror says what to do: the CLI prints them as one line."""

from __future__ import annotations

import errno
import io
import os
import stat
import tempfile
import textwrap
from pathlib import Path
from typing import Any

# Longest part of the target's name kept in the temp file's name (NAME_MAX is 255 on Linux).
_TMP_NAME_KEEP = 64


def _refuse(path: str | Path, errno_: int, why: str) -> OSError:
    """An OSError naming `path` with a readable reason: the CLI prints `error: PATH: why`
    (files sits below errors in the house, so it speaks OSError, not HiercollError)."""
    return OSError(errno_, why, os.fspath(path))


def output_target(path: str | Path) -> Path:
    """The regular file that writing to `path` replaces or creates: symlinks resolved. Refuses an
    empty path, a path naming a directory, and an existing target that is not a regular file."""
    text = os.fspath(path)
    if not text.strip():
        raise _refuse(text, errno.ENOENT, "output path is empty; give a file name")
    if text.endswith(("/", os.sep)) or Path(text).name in ("", ".", ".."):
        raise _refuse(text, errno.EISDIR, "is a directory; give a file path inside it")
    try:
        target = Path(os.path.realpath(text))
        st = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise _refuse(text, exc.errno or errno.EIO, f"cannot write ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(text, errno.EISDIR, "is a directory; give a file path inside it")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(text, errno.EINVAL, "is not a regular file (a device, FIFO or socket); "
                      "give the path of a file to write")
    return target


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write `data` to `path` (through a symlink) via a temp file beside the target and a rename:
    never a half-written file. Any problem is an OSError naming `path` (see output_target)."""
    target = output_target(path)
    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            keep_mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            keep_mode = 0o666 & ~umask  # mkstemp makes 0600; give a new file normal permissions
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:_TMP_NAME_KEEP]}.",
                                   suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, keep_mode)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise _refuse(path, exc.errno or errno.EIO, f"cannot write ({exc.strerror})") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> None:
    """A matplotlib figure as a PNG, written atomically like every other output."""
    output_target(path)              # refuse a bad path before the (slow) rendering
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    write_atomic(path, buf.getvalue())


def fit_title(fig: Any, text: str, fontsize: float) -> str:
    """`text` wrapped to the figure's width (a title longer than the figure was cut off at
    both edges of the PNG): about 0.55 em per character, a line per paragraph kept."""
    chars = max(20, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))
    return "\n".join(textwrap.fill(part, chars) for part in text.split("\n"))
