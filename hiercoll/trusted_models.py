"""Pydantic models built from values already checked, at a third of `model_construct`'s cost.

A dense 1024-rank all-to-all-v is two million `Split`s; `model_construct` spends 1.3-1.6 us on
each (4.5 of 17 CPU s of issue 29's dense all-to-all-v row), most of it generic work for
defaults, aliases and extras that these models do not have. `trusted_constructor` writes the
four slots a pydantic v2 instance has, the way `model_construct` fills them for a model without
defaults left out, extras or private attributes. `tests/test_trusted_models.py` holds it equal to
`model_construct` (values, fields set, dumps, equality, frozenness), so a pydantic that lays its
instances out otherwise fails there, not in a simulation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel


def trusted_constructor(cls: type[BaseModel]) -> Callable[..., Any]:
    """`cls(**values)` without validation, for values the caller has checked, every field given
    (a model with private attributes or extras is refused: its slots hold more)."""
    if cls.__private_attributes__ or cls.model_config.get("extra") == "allow":
        raise TypeError(f"{cls.__name__}: trusted_constructor builds plain models only")
    fields = frozenset(cls.model_fields)
    new, put = object.__new__, object.__setattr__

    def make(**values: Any) -> Any:
        obj = new(cls)
        put(obj, "__dict__", values)
        put(obj, "__pydantic_fields_set__", fields)
        put(obj, "__pydantic_extra__", None)
        put(obj, "__pydantic_private__", None)
        return obj
    return make
