"""One line when torchrun ends this rank before it has joined its process group.

A rank that dies while the job starts (killed, out of memory, a bad node) leaves its peers
waiting to join; torchrun then sends them SIGTERM and prints its own report. Without a handler
a surviving rank ends silently (no `error:` line of ours, only torchrun's ChildFailedError), and
the user cannot tell a start-up death from a failed collective. Once the group is up, a dead
peer is reported by the wait that notices it (harness/launch.py `peer_failures`).

Imports nothing heavy: `hiercoll.__main__` installs it before torch is imported.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

_starting = True
REPORT_GRACE_S = 2.0     # after start-up, how long a SIGTERM waits for this rank's own report


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def started() -> None:
    """The process group is up: from here a dead peer is reported where a wait notices it."""
    global _starting
    _starting = False


def start_up_line(rank: str) -> str:
    return (f"error: rank {rank}: ended by torchrun while joining the job: another rank exited "
            "first (torchrun's report below names it)")


def _watch_sigterm() -> None:
    """SIGTERM is blocked in every thread and taken here: a Python handler would only run when
    the main thread returns to Python, and a rank waiting to join sits in C++ (the store's
    connect) until its timeout."""
    signal.sigwait([signal.SIGTERM])
    if _starting:
        sys.stderr.write(start_up_line(os.environ.get("RANK", "?")) + "\n")
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)
    # after start-up: torchrun ends every rank once one has died, and the rank that saw the death
    # may be writing its line (the op and the peer) right now: a moment for it to finish and
    # exit by itself, then end as torchrun asked, by the signal itself (a CI run lost the line
    # to torchrun's SIGTERM under load)
    time.sleep(REPORT_GRACE_S)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    os.kill(os.getpid(), signal.SIGTERM)


def report_start_up_termination() -> None:
    """Under torchrun, first thing on the main thread (threads started later inherit the
    blocked SIGTERM): a SIGTERM before `started()` says so in one line."""
    if under_torchrun() and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        threading.Thread(target=_watch_sigterm, name="hiercoll-sigterm", daemon=True).start()
