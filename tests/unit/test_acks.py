"""The acknowledgement window against a model of the broker's side: a ``multiple`` ack names
an outstanding tag and settles every outstanding tag up to it, a single ack settles one. No
ack may name a settled tag (the broker would close the channel) or settle an incomplete one,
and whatever completes is settled after two batches, even behind a tag that never completes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hashq.worker.acks import AckWindow


class Broker:
    def __init__(self, tags: int) -> None:
        self.outstanding = set(range(1, tags + 1))
        self.complete: set[int] = set()

    def apply(self, upto: int, singles: list[int]) -> None:
        if upto:
            assert upto in self.outstanding, f"multiple ack of settled tag {upto}"
            settled = {tag for tag in self.outstanding if tag <= upto}
            assert settled <= self.complete, f"settles incomplete {settled - self.complete}"
            self.outstanding -= settled
        for tag in singles:
            assert tag in self.outstanding, f"single ack of settled tag {tag}"
            assert tag in self.complete
            self.outstanding.discard(tag)


@settings(max_examples=400)
@given(
    order=st.permutations(list(range(1, 41))),
    takes=st.lists(st.booleans(), min_size=40, max_size=40),
    stuck=st.none() | st.integers(1, 40),
    batch=st.integers(1, 10),
)
def test_acks_are_valid_and_complete(
    order: list[int], takes: list[bool], stuck: int | None, batch: int
) -> None:
    window, broker = AckWindow(batch), Broker(40)
    for tag, take_now in zip(order, takes, strict=True):
        if tag == stuck:
            continue  # a message held up forever (retrying, or a blocked key)
        broker.complete.add(tag)
        due = window.complete(tag)
        if due or take_now:
            broker.apply(*window.take())
    for _ in range(2):
        broker.apply(*window.take())
    assert broker.outstanding == ({stuck} if stuck else set())
    assert not window.pending


def test_in_order_completions_go_out_as_one_multiple_ack() -> None:
    window = AckWindow(batch=4)
    assert [window.complete(tag) for tag in (1, 2, 3, 4)] == [False, False, False, True]
    assert window.take() == (4, [])
    assert window.take() == (0, [])
