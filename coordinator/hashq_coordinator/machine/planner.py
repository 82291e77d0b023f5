"""The planner: which live worker should own each bucket. A pure function, no I/O.

- Balanced by capacity: each worker's quota is its share of the buckets, rounded so that the
  quotas add up to the bucket count (with equal capacities, max minus min is at most 1).
- Sticky: a bucket stays with its live owner while that owner is within its quota; only
  orphaned buckets and a worker's excess move. Remainder slots go first to the workers that
  already hold more, so rounding itself moves nothing it need not.
- Deterministic: the same inputs give the same plan, whatever the order of the mappings.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction


def quotas(buckets: int, capacities: Mapping[str, int], held: Mapping[str, int]) -> dict[str, int]:
    """How many buckets each worker should own; they add up to ``buckets``."""
    if not capacities:
        return {}
    total = sum(capacities.values())
    shares = {w: Fraction(buckets * c, total) for w, c in capacities.items()}
    result = {w: int(share) for w, share in shares.items()}  # floor: shares are non-negative
    remainder = buckets - sum(result.values())
    # Largest fractional part first; then whoever already holds more than its floor (giving
    # it the extra slot moves nothing); then id.
    order = sorted(
        capacities,
        key=lambda w: (-(shares[w] - result[w]), held.get(w, 0) <= result[w], w),
    )
    for worker in order[:remainder]:
        result[worker] += 1
    return result


def plan(
    buckets: int, capacities: Mapping[str, int], owners: Mapping[int, str | None]
) -> dict[int, str | None]:
    """The owner each bucket should have. ``owners`` maps buckets to their current (or
    committed) owner; owners that are not in ``capacities`` are gone."""
    if not capacities:
        return dict.fromkeys(range(buckets))
    kept: dict[str, list[int]] = {worker: [] for worker in capacities}
    for bucket in range(buckets):
        owner = owners.get(bucket)
        if owner in kept:
            kept[owner].append(bucket)
    quota = quotas(buckets, capacities, {w: len(bs) for w, bs in kept.items()})
    target: dict[int, str | None] = {}
    free: list[int] = []
    for worker in sorted(kept):
        mine = kept[worker]
        target.update(dict.fromkeys(mine[: quota[worker]], worker))
        free.extend(mine[quota[worker] :])
    free.extend(b for b in range(buckets) if owners.get(b) not in kept)
    openings = [w for w in sorted(kept) for _ in range(quota[w] - min(quota[w], len(kept[w])))]
    for bucket, worker in zip(sorted(free), openings, strict=True):
        target[bucket] = worker
    return dict(sorted(target.items()))


def moves(current: Mapping[int, str | None], target: Mapping[int, str | None]) -> int:
    """How many buckets change owner between two plans."""
    return sum(1 for bucket, owner in target.items() if current.get(bucket) != owner)
