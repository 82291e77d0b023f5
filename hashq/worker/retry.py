"""What to do after a handler failed: the pure retry policy.

Exponential backoff with full jitter, capped; after ``max_attempts`` the message is dead-lettered,
unless the policy is ``block``, which retries forever (a stalled key rather than a gap).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class OnFailure(enum.Enum):
    DEAD_LETTER = "dead-letter"
    BLOCK = "block"


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 30.0
    on_failure: OnFailure = OnFailure.DEAD_LETTER

    def next_delay(self, attempt: int, rng: random.Random | None = None) -> float | None:
        """Seconds to wait before attempt ``attempt + 1`` after attempt ``attempt`` (from 1)
        failed, or None when the message should be dead-lettered."""
        if attempt >= self.max_attempts and self.on_failure is OnFailure.DEAD_LETTER:
            return None
        ceiling = min(self.max_delay, self.base_delay * 2 ** min(attempt - 1, 30))
        return (rng or random).uniform(ceiling / 2, ceiling)
