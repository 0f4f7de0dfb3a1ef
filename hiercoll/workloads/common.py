"""What the workload front ends share: cutting a token count into equal parts, or saying how
much padding would make it cut."""

from __future__ import annotations

from collections.abc import Callable

from hiercoll.errors import HiercollError


def divide_evenly(total: int, parts: int, refusal: Callable[[int], str]) -> int:
    """total // parts when it divides; otherwise one line from `refusal(padding needed)`."""
    if total % parts:
        raise HiercollError(refusal(-total % parts))
    return total // parts
