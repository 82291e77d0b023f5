"""A fault proxy: one TCP listener on loopback per (process, server) pair, forwarding to the real
server, that the chaos run's fault schedule can break and heal. Test tooling, not shipped.

What a link can do, per direction (``up``: the process to the server; ``down``: back):

- pass (the default): bytes go through, after ``delay`` seconds, at most ``rate`` bytes a second;
- blackhole: bytes are accepted and held, nothing is closed: the half-open connection that
  neither side notices until a heartbeat or a session times out. New connections are accepted
  and held the same way;
- cut (both directions at once): every connection is reset (RST) and new ones are reset as they
  come, until the link heals.

``heal`` restores pass, with no delay and no limit, and delivers what a blackhole held, in
order, as TCP does once its retransmissions get through; a side that gave up meanwhile has
closed its socket, and that close goes through after the held bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket
import struct
from dataclasses import dataclass

log = logging.getLogger(__name__)

CHUNK = 65536
FLUSH_SECONDS = 5.0  # after both ends closed, what is still delayed may take this long
UP, DOWN = "up", "down"


class Mode(enum.Enum):
    PASS = "pass"
    """Bytes go through (delayed and throttled as the link says)."""
    BLACKHOLE = "blackhole"
    """Bytes are read and held until the heal; nothing is closed."""
    CUT = "cut"
    """Connections are reset, and new ones too."""


@dataclass
class Direction:
    mode: Mode = Mode.PASS
    delay: float = 0.0  # seconds added to every chunk
    rate: float = 0.0  # bytes a second at most; 0: no limit


class Link:
    """One listener forwarding to ``upstream``; ``port`` is where the process connects."""

    def __init__(self, name: str, upstream: tuple[str, int]) -> None:
        self.name = name
        self.upstream = upstream
        self.directions = {UP: Direction(), DOWN: Direction()}
        self.healed = asyncio.Event()  # set (and replaced) at each heal
        self._server: asyncio.Server | None = None
        self._pipes: set[_Pipe] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.reset()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    # ------------------------------------------------------------ faults
    def cut(self) -> None:
        """Reset every connection now, and every new one until ``heal``."""
        for direction in self.directions.values():
            direction.mode = Mode.CUT
        for pipe in list(self._pipes):
            pipe.reset()

    def blackhole(self, *directions: str) -> None:
        for name in directions or (UP, DOWN):
            self.directions[name].mode = Mode.BLACKHOLE

    def slow(self, delay: float, rate: float = 0.0, *directions: str) -> None:
        for name in directions or (UP, DOWN):
            self.directions[name].delay, self.directions[name].rate = delay, rate

    def heal(self) -> None:
        for name in (UP, DOWN):
            self.directions[name] = Direction()
        self.healed.set()  # wakes what a blackhole held
        self.healed = asyncio.Event()

    @property
    def connections(self) -> int:
        """Connections open through the link now."""
        return len(self._pipes)

    @property
    def longest_delay(self) -> float:
        return max(d.delay for d in self.directions.values())

    @property
    def broken(self) -> bool:
        return any(d.mode is not Mode.PASS or d.delay or d.rate for d in self.directions.values())

    # ------------------------------------------------------------ forwarding
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.directions[UP].mode is Mode.CUT:
            _reset(writer)
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(writer)  # the server is down: the process sees its connect fail
            return
        pipe = _Pipe(self, (reader, writer), (server_reader, server_writer))
        self._pipes.add(pipe)
        try:
            await pipe.run()
        finally:
            self._pipes.discard(pipe)


class _Pipe:
    """One proxied connection: each way, a reader that stamps every chunk with the time it may
    go on (now plus the delay: a latency, not a throughput limit) and a writer that sends it
    then, at most at the rate."""

    def __init__(
        self,
        link: Link,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self._link = link
        self._client, self._server = client, server
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        up: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        down: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        readers = [
            asyncio.ensure_future(self._read(self._client[0], up, UP)),
            asyncio.ensure_future(self._read(self._server[0], down, DOWN)),
        ]
        writers = [
            asyncio.ensure_future(self._write(up, self._server[1], UP)),
            asyncio.ensure_future(self._write(down, self._client[1], DOWN)),
        ]
        self._tasks = [*readers, *writers]
        try:
            await asyncio.gather(*readers)  # both ends closed
            # What is still on its way goes on, then each end is closed in order.
            await asyncio.wait(writers, timeout=FLUSH_SECONDS + self._link.longest_delay)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a socket failed, or the link reset it: what is left goes with the reset
        finally:
            self.reset()

    def reset(self) -> None:
        """Both sockets closed with an RST, every task stopped."""
        for task in self._tasks:
            task.cancel()
        _reset(self._client[1])
        _reset(self._server[1])

    async def _read(
        self, source: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]], name: str
    ) -> None:
        loop = asyncio.get_running_loop()
        while chunk := await source.read(CHUNK):  # blackholed too: the sender never knows
            queue.put_nowait((loop.time() + self._link.directions[name].delay, chunk))
        queue.put_nowait((loop.time() + self._link.directions[name].delay, b""))  # its end

    async def _write(
        self, queue: asyncio.Queue[tuple[float, bytes]], sink: asyncio.StreamWriter, name: str
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, chunk = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            while (rule := self._link.directions[name]).mode is Mode.BLACKHOLE:
                await self._link.healed.wait()  # held, in order, until the heal
            if rule.mode is Mode.CUT:
                return  # the pipe is being reset
            if not chunk:  # the sender closed its side: so does the proxy, after the rest
                if sink.can_write_eof():
                    sink.write_eof()
                return
            sink.write(chunk)
            await sink.drain()
            if rule.rate:
                await asyncio.sleep(len(chunk) / rule.rate)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), not a FIN: the peer sees "connection reset"."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
