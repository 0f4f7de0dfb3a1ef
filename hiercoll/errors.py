"""Exception types. User-input problems are `HiercollError`s: the CLI prints their one line and exits 2."""

from __future__ import annotations

import difflib

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
    """First pydantic error as `source: field.path: message`. A misspelt key shows up twice (the
    right key missing, the typo unknown): the typo is named, with the key it resembles."""
    errors = err.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing"
                   and e["loc"][:-1] == first["loc"][:-1]]
        close = difflib.get_close_matches(str(first["loc"][-1]), missing, n=1)
        msg = (f"unknown field; did you mean {close[0]}?" if close else
               "unknown field; remove it or check the spelling (see `hiercoll topo schema`)")
    elif first["type"] == "missing":
        msg = "required field is missing"
    return f"{source}: {loc}: {msg}" if loc else f"{source}: {msg}"
