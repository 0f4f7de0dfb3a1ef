"""Byte sizes as people write them (`64MiB`, `1GiB`, `4096`, `4KiB:1GiB`) and back."""

from __future__ import annotations

import re

from hiercoll.errors import HiercollError

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int, what: str = "size") -> int:
    """Parse `64MiB`, `1GiB`, `4096`, `1.5KiB` into bytes. KiB/MiB are binary, KB/MB decimal."""
    if isinstance(text, int):
        if text < 0:
            raise HiercollError(f"{what}: {text} is negative; give a byte count >= 0")
        return text
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise HiercollError(f"{what}: cannot read {text!r}; write e.g. 4096, 64KiB, 16MiB, 1GiB")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value != int(value):
        raise HiercollError(f"{what}: {text!r} is not a whole number of bytes")
    return int(value)


def parse_size_range(text: str, what: str = "--sizes") -> list[int]:
    """`4KiB:1GiB` -> powers-of-two steps from 4 KiB to 1 GiB; `a:b:f` uses factor f; `a,b,c` a list."""
    if "," in text:
        return [parse_size(t, what) for t in text.split(",") if t.strip()]
    parts = text.split(":")
    if len(parts) == 1:
        return [parse_size(parts[0], what)]
    if len(parts) not in (2, 3):
        raise HiercollError(f"{what}: {text!r} should be LOW:HIGH or LOW:HIGH:FACTOR, e.g. 4KiB:1GiB")
    low, high = parse_size(parts[0], what), parse_size(parts[1], what)
    factor = int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else 2
    if low <= 0 or high < low or factor < 2:
        raise HiercollError(f"{what}: {text!r} needs 0 < LOW <= HIGH and an integer FACTOR >= 2")
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    return sizes


def format_size(nbytes: int) -> str:
    """Shortest exact binary form: 65536 -> '64KiB', 1000 -> '1000B'."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"
