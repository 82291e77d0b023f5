"""hashq._io.direct: a bucket channel's deliveries handed over in its reader, read as aiormq
reads them; and a tripwire for the aiormq internals it relies on."""

from __future__ import annotations

import inspect
import logging

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


async def test_a_failing_callback_is_said_and_the_reader_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel = _Channel([ContentHeader(body_size=0), ContentHeader(body_size=0)])
    calls = []

    def fails(message: DeliveredMessage) -> None:
        calls.append(message.delivery_tag)
        raise ValueError("sequence number 1 seen twice")

    deliver_directly(channel, fails)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, "hashq._io.direct"):
        await channel._on_deliver_frame(_deliver(1))
        await channel._on_deliver_frame(_deliver(2))
    assert calls == [1, 2]
    assert [r.getMessage() for r in caplog.records] == ["a delivery's callback failed"] * 2


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
