"""The fuzz oracle (tests/fuzz) over hypothesis-drawn inputs: topology files, sizes, parameters
and flags of `plan`, and `autopick --sizes`. Hypothesis shrinks a failure to a small case."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.core import failure, judge
from tests.fuzz.strategies import autopick_argvs, plan_argvs


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_drawn_cli_inputs_are_answered_or_refused_in_one_line(tmp_path: Path, data: st.DataObject) -> None:
    argv = data.draw(st.one_of(plan_argvs(tmp_path), autopick_argvs()))
    o = judge(argv, case_timeout=20.0)
    assert failure(o) is None, (failure(o), argv, o.traceback)
