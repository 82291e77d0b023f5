"""Loaded (as ``sitecustomize``) only by chaos processes under libfaketime
(``tools.chaos.clock``): its 0.9.10 makes ``clock_nanosleep`` fail with EINVAL when the
monotonic clock is left real, so ``time.sleep`` waits in ``select`` instead, on the same
monotonic clock."""

import os
import select
import time

if "faketime" in os.environ.get("LD_PRELOAD", ""):

    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            select.select([], [], [], left)

    time.sleep = _sleep  # type: ignore[assignment]  # floats and ints, as callers pass
