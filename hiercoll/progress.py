"""A transient progress bar on a terminal's stderr; elsewhere a line per step, or nothing.

On a terminal: a bar. Elsewhere (a pipe, a CI log) a transient bar leaves a blank line in
stderr, so steps that take seconds each (`lines=True`: the auto-picker's sizes) print one
`title: done/total` line each, a piped sweep no longer silent for minutes; fine-grained reports
(a simulation's ops) print nothing there. The planner and the CLI both use it, so it lives
below both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# (done, total)
Report = Callable[[int, int], None]


def _ignore(done: int, total: int) -> None:
    """What a bar that is not shown does with a report."""


@contextmanager
def terminal_bar(title: str, show: bool = True, console: Any = None,
                 lines: bool = False) -> Iterator[Report]:
    """Yields report(done, total): a bar on stderr when `show` and stderr is a terminal; with
    `lines` and `show`, one line per report elsewhere; else a no-op. `console`: a rich Console
    to draw on instead of stderr's."""
    from rich.console import Console
    console = console or Console(stderr=True, highlight=False)
    if show and lines and not console.is_terminal:
        yield lambda done, total: console.print(f"{title}: {done}/{total}", markup=False,
                                                highlight=False, soft_wrap=True)
        return
    if not show or not console.is_terminal:
        yield _ignore
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        # until the first report the work is still being set up (a big plan's ops built, its
        # symmetry checked): say so, rather than a bar stuck at 0/?
        task = bar.add_task(f"{title}: preparing", total=None)
        yield lambda done, total: bar.update(task, description=title, completed=done,
                                             total=total)
