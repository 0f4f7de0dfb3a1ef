"""`trusted_constructor` builds what `model_construct` builds: this is the guard on the pydantic
internals it writes (a pydantic that lays its instances out otherwise fails here)."""

from __future__ import annotations

import pydantic
import pytest

from hiercoll.collectives import GroupSplits, RankSplits, Split
from hiercoll.trusted_models import trusted_constructor


@pytest.mark.parametrize("cls,values", [
    (Split, {"size": 7, "peers": [3]}),
    (RankSplits, {"input": [Split(size=1, peers=[0])], "output": []}),
])
def test_it_builds_what_model_construct_builds(cls, values):
    fast, slow = trusted_constructor(cls)(**values), cls.model_construct(**values)
    assert type(fast) is cls and fast == slow and slow == fast
    assert fast.model_dump() == slow.model_dump() and fast.model_dump_json() == slow.model_dump_json()
    assert fast.model_fields_set == slow.model_fields_set
    assert vars(fast) == vars(slow) and repr(fast) == repr(slow)
    assert fast.model_copy(update={}) == slow
    with pytest.raises(pydantic.ValidationError):      # frozen, as the model says
        fast.size = 1 if cls is Split else None  # type: ignore[misc]


def test_splits_from_counts_equal_the_validated_splits():
    counts = [[0, 3, 1], [2, 0, 0], [5, 4, 1]]
    made = GroupSplits.from_counts(counts)
    checked = GroupSplits.model_validate(made.model_dump())
    assert made == checked and checked == made
    assert made.model_dump_json() == checked.model_dump_json()


def test_models_with_more_slots_are_refused():
    class Private(pydantic.BaseModel):
        _hidden: int = 0
        x: int

    with pytest.raises(TypeError, match="plain models only"):
        trusted_constructor(Private)
