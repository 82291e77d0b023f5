"""What to do after a handler failed: the pure retry policy.

Exponential backoff with full jitter, capped; after ``max_attempts`` the message is dead-lettered,
or its key parked (``park``: the key steps aside, in order, until released), unless the policy is
``block``, which retries forever (a stalled key rather than a gap).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hashq.settings import WorkerSettings


class OnFailure(enum.Enum):
    DEAD_LETTER = "dead-letter"
    BLOCK = "block"
    PARK = "park"


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 30.0
    on_failure: OnFailure = OnFailure.DEAD_LETTER

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> RetryPolicy:
        return cls(
            max_attempts=settings.max_attempts,
            base_delay=settings.retry_base_delay,
            max_delay=settings.retry_max_delay,
            on_failure=OnFailure(settings.on_failure),
        )

    def next_delay(self, attempt: int, rng: random.Random | None = None) -> float | None:
        """Seconds to wait before attempt ``attempt + 1`` after attempt ``attempt`` (from 1)
        failed, or None when it gives up (dead-letter the message, or park its key)."""
        if attempt >= self.max_attempts and self.on_failure is not OnFailure.BLOCK:
            return None
        ceiling = min(self.max_delay, self.base_delay * 2 ** min(attempt - 1, 30))
        return (rng or random).uniform(ceiling / 2, ceiling)
