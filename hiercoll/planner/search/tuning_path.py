"""A --tuning path must be a file: a mistyped path is an error, not a silent search. Apart so that
the selector and the auto-picker both check it without importing each other."""

from __future__ import annotations

from pathlib import Path

from hiercoll.errors import HiercollError


def check_tuning_path(tuning: str | Path) -> None:
    p = Path(tuning)
    if p.is_dir():
        raise HiercollError(f"--tuning {p}: is a directory; give the tuning.json that "
                            "`hiercoll autopick -o` wrote")
    if not p.is_file():
        raise HiercollError(f"--tuning {p}: no such file; make it with `hiercoll autopick ... "
                            "-o tuning.json` or leave --tuning out to search")
