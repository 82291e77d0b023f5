"""The raw consumer's shape reaches its process whole (tools.bench.raw.Shape)."""

from __future__ import annotations

import pytest

from tools.bench.raw import ACK_EVERY, PREFETCH, Shape
from tools.bench.shapes import SHAPES


@pytest.mark.parametrize("shape", [*SHAPES.values(), Shape(direct=True)])
def test_a_shape_goes_through_the_environment_unchanged(
    shape: Shape, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in shape.environment().items():
        monkeypatch.setenv(name, value)
    assert Shape.from_environment() == shape


def test_without_a_shape_the_raw_consumer_is_a_plain_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HASHQ_BENCH_RAW_SHAPE", raising=False)
    plain = Shape.from_environment()
    assert (plain.per_bucket, plain.prefetch, plain.ack_every, plain.direct) == (
        False,
        PREFETCH,
        ACK_EVERY,
        False,
    )
