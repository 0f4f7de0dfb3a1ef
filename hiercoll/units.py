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
_SIZE_RE = re.compile(r"^\s*([0-9]+)(?:\.([0-9]+))?\s*([a-zA-Z]*)\s*$", re.ASCII)
# The largest size anything accepts: tuning tables end at 2**62, and byte counts stay int64-safe.
MAX_SIZE = 2**62
_HINT = "write e.g. 4096, 64KiB, 16MiB, 1GiB"


def parse_size(text: str | int, what: str = "size") -> int:
    """Parse `64MiB`, `1GiB`, `4096`, `1.5KiB` into bytes, exactly (integer arithmetic, never
    floats). KiB/MiB are binary, KB/MB decimal. Above MAX_SIZE, fractions of a byte: refused."""
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise HiercollError(f"{what}: cannot read {text!r}; {_HINT}")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(text)
        if not m or m.group(3).lower() not in _UNITS:
            raise HiercollError(f"{what}: cannot read {text!r}; {_HINT}")
        whole, frac, unit = m.group(1), m.group(2) or "", m.group(3).lower()
        if len(whole) + len(frac) > 40:
            raise HiercollError(f"{what}: {text!r} is too large; at most {MAX_SIZE} bytes")
        scale = _UNITS[unit]
        numerator = (int(whole) * 10 ** len(frac) + int(frac or "0")) * scale
        value, rest = divmod(numerator, 10 ** len(frac))
        if rest:
            raise HiercollError(f"{what}: {text!r} is not a whole number of bytes")
    if value < 0:
        raise HiercollError(f"{what}: {text} is negative; give a byte count >= 0")
    if value > MAX_SIZE:
        raise HiercollError(f"{what}: {text!r} is too large; at most {MAX_SIZE} bytes (2**62)")
    return value


def _factor(text: str, whole: str, what: str) -> int:
    if not re.fullmatch(r"\s*[0-9]{1,6}\s*", text, re.ASCII) or int(text) < 2:
        raise HiercollError(f"{what}: {whole!r}: FACTOR {text.strip()!r} should be an integer >= 2, "
                            "e.g. 4KiB:1GiB:4")
    return int(text)


def parse_size_range(text: str, what: str = "--sizes") -> list[int]:
    """`4KiB:1GiB` -> powers-of-two steps from 4 KiB to 1 GiB; `a:b:f` uses factor f; `a,b,c` a list."""
    if "," in text:
        sizes = [parse_size(t, what) for t in text.split(",") if t.strip()]
        if not sizes:
            raise HiercollError(f"{what}: {text!r} lists no size; write e.g. 4KiB,1MiB or 4KiB:1GiB")
        return sizes
    parts = text.split(":")
    if len(parts) == 1:
        return [parse_size(parts[0], what)]
    if len(parts) not in (2, 3):
        raise HiercollError(f"{what}: {text!r} should be LOW:HIGH or LOW:HIGH:FACTOR, e.g. 4KiB:1GiB")
    low, high = parse_size(parts[0], what), parse_size(parts[1], what)
    factor = _factor(parts[2], text, what) if len(parts) == 3 else 2
    if low <= 0 or high < low:
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
