"""Exception types. User-input problems are `HiercollError`s: the CLI prints their one line and exits 2."""

from __future__ import annotations

from pydantic import ValidationError


class HiercollError(ValueError):
    """Bad input from a user (file, flag, argument). The message names the field and the fix."""


class ScheduleError(HiercollError):
    """A schedule that is structurally wrong (bad ids, bounds, cycles). Names the op."""


class ReferenceTooLarge(HiercollError):
    """The reference executor cannot run this plan on data within its memory limit (callers
    that can fall back to the static check catch this, not a message)."""


class OpLimitError(HiercollError):
    """Walking the plan's ranks would build more ops than HIERCOLL_MAX_OPS allows (callers that
    can do without the walk, e.g. counting a recipe's ops, catch this, not a message)."""


class VerificationError(Exception):
    """A schedule that runs but computes the wrong result, races or deadlocks."""


def format_validation_error(err: ValidationError, source: str) -> str:
    """First pydantic error as `source: field.path: message`."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field; remove it or check the spelling (see `hiercoll topo schema`)"
    elif first["type"] == "missing":
        msg = "required field is missing"
    return f"{source}: {loc}: {msg}" if loc else f"{source}: {msg}"
