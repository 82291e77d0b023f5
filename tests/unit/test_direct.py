"""hashq._io.direct: a bucket channel's deliveries handed over in the connection's reader as
their frames come, or else in the channel's reader, read as aiormq reads them; and a tripwire
for the aiormq internals it relies on."""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import aiormq
import pytest
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from hashq._io.direct import deliver_directly, supported


class _Channel:
    """The members of an aiormq channel that ``deliver_directly`` uses, with aiormq's own
    ``_read_content`` reading the frames queued here."""

    _read_content = aiormq.Channel._read_content
    _Channel__get_content_frame = aiormq.Channel._Channel__get_content_frame  # type: ignore[attr-defined]

    is_closed = False

    def __init__(self, frames: list[object]) -> None:
        self.consumers = {"ctag": object()}
        self._frames = frames

    async def _get_frame(self) -> object:
        return self._frames.pop(0)

    async def _on_deliver_frame(self, frame: spec.Basic.Deliver) -> None:
        raise AssertionError("aiormq's own path taken")


def _deliver(tag: int, consumer: str = "ctag") -> spec.Basic.Deliver:
    return spec.Basic.Deliver(consumer, tag, False, "hashq.t", "key")


def test_aiormq_reader_still_hands_deliveries_to_the_method_replaced() -> None:
    """If a new aiormq stops calling ``_on_deliver_frame`` through the channel, the
    replacement would be silently skipped: deliveries would be slower, not lost."""
    assert "self._on_deliver_frame(frame)" in inspect.getsource(aiormq.Channel._reader)


def test_aiormq_connection_reader_puts_each_frame_in_its_channels_queue() -> None:
    """If a new aiormq stops calling the queue's ``put`` for a channel's frames, deliveries
    go through the channel's reader, slower; if it put some frames another way, a delivery
    read in the connection's reader could pass a frame queued before it."""
    reader = inspect.getsource(aiormq.Connection._Connection__reader)  # type: ignore[attr-defined]
    assert "await ch.frames.put((weight, frame))" in reader
    assert "frames.put_nowait" not in inspect.getsource(aiormq.connection)
    assert "self.frames: asyncio.Queue = asyncio.Queue(" in inspect.getsource(aiormq.Channel)


def test_the_installed_aiormq_has_what_the_replacement_relies_on() -> None:
    channel = object.__new__(aiormq.Channel)  # its members, without a connection
    channel.consumers = {}
    assert supported(channel)


def test_aiormq_reads_a_delivery_as_the_replacement_does() -> None:
    """The replacement is aiormq's own ``_on_deliver_frame`` but for its last lines (a task
    per delivery): if aiormq reads a delivery otherwise, look again."""
    own = inspect.getsource(aiormq.Channel._on_deliver_frame)
    assert "header: ContentHeader = await self.__get_content_header()" in own
    assert "message = await self._read_content(frame, header)" in own


async def test_a_delivery_is_read_whole_and_handed_over_in_the_readers_call() -> None:
    header = ContentHeader(body_size=6, properties=spec.Basic.Properties(message_id="m1"))
    channel = _Channel([header, ContentBody(b"abc"), ContentBody(b"def")])
    got: list[DeliveredMessage] = []
    assert deliver_directly(channel, got.append)  # type: ignore[arg-type]
    await channel._on_deliver_frame(_deliver(1))
    [message] = got  # in the call itself, not in a task for later
    assert (message.body, message.delivery_tag, message.header.properties.message_id) == (
        b"abcdef",
        1,
        "m1",
    )


async def test_a_delivery_to_a_cancelled_consumer_is_read_and_not_handed_over() -> None:
    channel = _Channel([ContentHeader(body_size=0)])
    got: list[DeliveredMessage] = []
    deliver_directly(channel, got.append)  # type: ignore[arg-type]
    await channel._on_deliver_frame(_deliver(1, consumer="gone"))
    assert got == [] and channel._frames == []


async def test_a_frame_out_of_place_fails_the_channel_as_aiormq_would() -> None:
    channel = _Channel([_deliver(2)])
    deliver_directly(channel, lambda message: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="instead of ContentHeader"):
        await channel._on_deliver_frame(_deliver(1))


def test_a_method_called_otherwise_is_not_relied_on() -> None:
    class Changed(_Channel):
        async def _read_content(  # type: ignore[override]
            self, frame: object, header: object, more: object
        ) -> None:
            raise AssertionError("not called")

    changed = Changed([])
    assert not deliver_directly(changed, lambda message: None)  # type: ignore[arg-type]
    assert changed._on_deliver_frame.__func__ is _Channel._on_deliver_frame  # type: ignore[attr-defined]


def test_an_aiormq_without_what_it_takes_is_left_as_it_is() -> None:
    class Other:
        def __init__(self) -> None:
            self.consumers: dict[str, object] = {}

    other = Other()
    assert not deliver_directly(other, lambda message: None)  # type: ignore[arg-type]
    assert not hasattr(other, "_on_deliver_frame")


# ---------------------------------------------------------------- in the connection's reader
class _Queued(_Channel):
    """A channel whose frames the connection's reader puts in its queue, as aiormq's do."""

    def __init__(self, maxsize: int = 10) -> None:
        super().__init__([])
        self.frames: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(maxsize=maxsize)

    def queued(self) -> list[Any]:
        return [self.frames.get_nowait()[1] for _ in range(self.frames.qsize())]


def _frames(tag: int, *parts: bytes, consumer: str = "ctag") -> list[object]:
    size = sum(len(part) for part in parts)
    header = ContentHeader(body_size=size, properties=spec.Basic.Properties(message_id=f"m{tag}"))
    return [_deliver(tag, consumer), header, *(ContentBody(part) for part in parts)]


async def _put(channel: _Queued, frames: list[object]) -> None:
    for frame in frames:
        await channel.frames.put((1, frame))


async def test_a_delivery_is_handed_over_as_its_last_frame_comes_and_nothing_is_queued() -> None:
    channel = _Queued()
    got: list[DeliveredMessage] = []
    deliver_directly(channel, got.append)  # type: ignore[arg-type]
    await _put(channel, _frames(1, b"abc", b"def")[:-1])
    assert got == []  # its last body frame is still to come
    await _put(channel, [ContentBody(b"def"), *_frames(2), *_frames(3, b"x")])
    assert [(m.delivery_tag, m.body, m.header.properties.message_id) for m in got] == [
        (1, b"abcdef", "m1"),
        (2, b"", "m2"),
        (3, b"x", "m3"),
    ]
    assert channel.queued() == []


async def test_a_delivery_behind_a_queued_frame_is_queued_behind_it() -> None:
    """A frame the channel's reader has not taken yet (here a reply) comes first: the delivery
    after it goes to the queue too, in order, and the channel's reader hands it over."""
    channel = _Queued()
    got: list[DeliveredMessage] = []
    deliver_directly(channel, got.append)  # type: ignore[arg-type]
    reply = spec.Basic.QosOk()
    await _put(channel, [reply, *_frames(1, b"a")])
    assert got == []
    queued = channel.queued()
    assert queued[0] is reply and [type(f) for f in queued[1:]] == [
        spec.Basic.Deliver,
        ContentHeader,
        ContentBody,
    ]
    await _put(channel, _frames(2, b"b"))  # the queue was emptied: read here again
    assert [m.delivery_tag for m in got] == [2]


async def test_frames_other_than_a_deliverys_are_queued_with_the_queues_own_wait() -> None:
    channel = _Queued(maxsize=1)
    deliver_directly(channel, lambda message: None)  # type: ignore[arg-type]
    await channel.frames.put((1, spec.Basic.QosOk()))
    second = asyncio.ensure_future(channel.frames.put((1, spec.Basic.CancelOk("ctag"))))
    await asyncio.sleep(0.01)
    assert not second.done()  # the queue is full: the connection's reader waits, as before
    channel.frames.get_nowait()
    await asyncio.wait_for(second, 1)
    assert isinstance(channel.queued()[0], spec.Basic.CancelOk)


async def test_a_delivery_to_a_cancelled_consumer_or_a_closed_channel_is_read_and_dropped() -> None:
    channel = _Queued()
    got: list[DeliveredMessage] = []
    deliver_directly(channel, got.append)  # type: ignore[arg-type]
    await _put(channel, [*_frames(1, b"a", consumer="gone"), *_frames(2, b"b")])
    channel.is_closed = True
    await _put(channel, _frames(3, b"c"))
    assert [m.delivery_tag for m in got] == [2] and channel.queued() == []


@pytest.mark.parametrize("reader", ["the channel's", "the connection's"])
async def test_a_failing_callback_is_said_and_the_reader_goes_on(
    reader: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def fails(message: DeliveredMessage) -> None:
        calls.append(message.delivery_tag)
        raise ValueError("sequence number 1 seen twice")

    with caplog.at_level(logging.ERROR, "hashq._io.direct"):
        if reader == "the channel's":
            channel = _Channel([ContentHeader(body_size=0), ContentHeader(body_size=0)])
            deliver_directly(channel, fails)  # type: ignore[arg-type]
            await channel._on_deliver_frame(_deliver(1))
            await channel._on_deliver_frame(_deliver(2))
        else:
            queued = _Queued()
            deliver_directly(queued, fails)  # type: ignore[arg-type]
            await _put(queued, [*_frames(1, b"a"), *_frames(2, b"b")])
    assert calls == [1, 2]
    assert [r.getMessage() for r in caplog.records] == ["a delivery's callback failed"] * 2


async def test_a_frame_out_of_place_is_queued_behind_the_delivery_it_interrupts() -> None:
    """The channel's reader then fails the channel, as aiormq's would (above)."""
    channel = _Queued()
    deliver_directly(channel, lambda message: None)  # type: ignore[arg-type]
    deliver, header, _ = _frames(1, b"ab")
    stray = _deliver(2)
    await _put(channel, [deliver, header, stray])
    assert channel.queued() == [deliver, header, stray]
