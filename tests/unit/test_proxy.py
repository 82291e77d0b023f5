"""The chaos run's fault proxy, against an echo server in this process: each fault does what it
says, and healing undoes it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tools.chaos.proxy import DOWN, UP, Link


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def link() -> AsyncIterator[Link]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    proxy = Link("test", ("127.0.0.1", int(server.sockets[0].getsockname()[1])))
    await proxy.start()
    yield proxy
    await proxy.close()
    server.close()


async def _connect(link: Link) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", link.port)


async def _round_trip(link: Link, data: bytes = b"ping") -> bytes:
    reader, writer = await _connect(link)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.readexactly(len(data)), 2)
    finally:
        writer.close()


async def test_bytes_pass_and_a_close_delivers_everything_first(link: Link) -> None:
    reader, writer = await _connect(link)
    payload = b"x" * 300_000
    writer.write(payload)
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), 5) == payload  # then the end, in order


async def test_a_cut_resets_every_connection_and_refuses_new_ones_until_healed(
    link: Link,
) -> None:
    reader, writer = await _connect(link)
    assert await _round_trip(link) == b"ping"
    link.cut()
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        writer.write(b"after the cut")
        await writer.drain()
        await asyncio.wait_for(reader.readexactly(1), 2)
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await _round_trip(link)
    link.heal()
    assert await _round_trip(link) == b"ping"


async def test_a_blackhole_holds_bytes_closes_nothing_and_the_heal_delivers_them(
    link: Link,
) -> None:
    reader, writer = await _connect(link)
    link.blackhole(UP)
    writer.write(b"held")
    await writer.drain()  # the sender's writes succeed
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.5)  # no answer, and no end either
    assert not reader.at_eof()
    link.heal()
    assert await asyncio.wait_for(reader.readexactly(4), 2) == b"held"  # as TCP retransmits
    writer.close()


async def test_a_blackhole_of_the_answers_only_holds_them_until_the_heal(link: Link) -> None:
    reader, writer = await _connect(link)
    link.blackhole(DOWN)
    writer.write(b"ping")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(4), 0.5)
    link.heal()
    assert await asyncio.wait_for(reader.readexactly(4), 2) == b"ping"
    writer.close()


async def test_a_delay_is_added_each_way_without_limiting_throughput(link: Link) -> None:
    link.slow(0.2)
    began = time.monotonic()
    assert await _round_trip(link) == b"ping"
    assert time.monotonic() - began >= 0.4
    began = time.monotonic()
    reader, writer = await _connect(link)
    for _ in range(20):  # chunks read one by one, in flight together: a latency, not a queue
        writer.write(b"y" * 1000)
        await writer.drain()
        await asyncio.sleep(0.02)
    await asyncio.wait_for(reader.readexactly(20_000), 10)
    assert time.monotonic() - began < 2.0  # one delay per chunk would take 20 x 0.4 s
    writer.close()


async def test_a_server_that_is_down_resets_the_connection() -> None:
    unused = Link("nowhere", ("127.0.0.1", 9))
    await unused.start()
    try:
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            await _round_trip(unused)
    finally:
        await unused.close()
