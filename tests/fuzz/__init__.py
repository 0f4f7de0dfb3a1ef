"""A small mutation fuzzer over hiercoll's input surfaces (issue 15, section 5).

Every case runs `hiercoll.cli.main.main(argv)` in this process under a per-case time limit and
asserts: the exit code is 0, 1 or 2; nothing escapes as a traceback; an error is one line; and a
plan the CLI accepted (`plan -o`) is correct: `hiercoll.verify` on it passes (checker + numpy
reference on random data). Inputs: topology files (YAML/JSON, structurally mutated), plan files
(expanded and recipe, mutated), splits files, tuning files, sizes, node counts, algorithm
parameters and other CLI flags.

    python -m tests.fuzz --cases 5000 --seed 1        # the long profile (make fuzz)

The quick profile (a few hundred cases) runs in `make test` from tests/test_fuzz_quick.py.
KNOWN lists tracebacks found in code other engineers are fixing, keyed by exception class and a
message pattern; they are counted and reported, not failed, and the list shrinks as fixes land.
"""

from tests.fuzz.core import KNOWN, Outcome, Summary, run_cases

__all__ = ["KNOWN", "Outcome", "Summary", "run_cases"]
