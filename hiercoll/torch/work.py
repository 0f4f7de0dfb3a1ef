"""The handle an `async_op=True` call returns, shaped like torch.distributed's Work.

On cuda the call was enqueued on the communicator's stream and the handle holds a CUDA event
recorded after it: `wait()` makes the *current stream* wait for it (no host sync, so it is safe in
a captured graph), like NCCL's Work. On gloo every call completes before it returns (it runs
on the calling thread), so the handle is already complete.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch


class Work:
    def __init__(self, event: Any = None, result: Any = None) -> None:
        self._event = event            # torch.cuda.Event, or None (completed eagerly)
        self._result = result

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        return self._event is None or bool(self._event.query())

    def is_success(self) -> bool:
        return self.is_completed()

    def synchronize(self) -> None:
        """Block the host until the call is done (not inside graph capture)."""
        if self._event is not None:
            self._event.synchronize()

    def result(self) -> Any:
        return self._result
