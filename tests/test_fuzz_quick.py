"""The quick fuzz profile (tests/fuzz): a few hundred CLI cases over topology, plan, splits and
tuning files, sizes and flags; exit 0/1/2 only, no traceback, one line on error, no hang, and
every accepted plan verifies. `make fuzz` runs the long profile."""

from tests.fuzz import run_cases


def test_quick_fuzz_profile_is_clean():
    summary = run_cases(300, seed=7, case_timeout=10.0, budget_s=25.0)
    assert summary.cases >= 100
    assert summary.clean, summary.report()
