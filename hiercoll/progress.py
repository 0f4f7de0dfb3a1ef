"""A transient progress bar on a terminal's stderr, or nothing.

Only on a terminal: elsewhere (a pipe, a CI log, a test) a transient bar leaves a blank line in
stderr, and an error printed after it is no longer one line. The planner and the CLI both use
it (the auto-picker's sizes, a long simulation's ops), so it lives below both.
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
def terminal_bar(title: str, show: bool = True, console: Any = None) -> Iterator[Report]:
    """Yields report(done, total): a bar on stderr when `show` and stderr is a terminal, else
    a no-op. `console`: a rich Console to draw on instead of stderr's."""
    from rich.console import Console
    console = console or Console(stderr=True, highlight=False)
    if not show or not console.is_terminal:
        yield _ignore
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(title, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
