"""The naive designs hashq replaces, run as chaos consumers
(``python -m tools.chaos.naive split|lock``) against the same workload and faults. Each is
written the way its users write it, reasonably and
without hashq's coordinator, drain or fence:

- ``split``: the consistent-hash exchange straight onto N queues; the live consumers, known
  through ephemeral ZooKeeper nodes, split the queues between them by rank (queue i goes to
  member i mod n) and re-split whenever membership changes: a consumer cancels the queues it
  lost (finishing what it already holds) and starts on the ones it gained at once. Each queue's
  messages are processed one at a time, in delivery order.
- ``lock``: one shared queue with competing consumers; a message runs only if its consumer
  takes the key's lock (an ephemeral ZooKeeper node), otherwise it is requeued.

Neither has a fencing token: executions are recorded with epoch None.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError

from hashq._io.zk import close_zk, connect_zk
from hashq.settings import Settings, load_settings
from tools.chaos.handler import execute
from tools.polling import eventually

PREFETCH = 20
log = logging.getLogger("tools.chaos.naive")


def exchange_name(design: str, app: str) -> str:
    return f"naive-{design}.{app}"


def queue_names(design: str, app: str, buckets: int) -> list[str]:
    if design == "lock":
        return [f"naive-lock.{app}.queue"]
    return [f"naive-split.{app}.q{index:04d}" for index in range(buckets)]


def zk_root(design: str, app: str) -> str:
    return f"/naive/{app}/{design}"


async def declare(settings: Settings, design: str) -> None:
    """The design's exchange and durable quorum queues (as durable as hashq's buckets)."""
    connection = await aio_pika.connect(settings.amqp_urls[0])
    async with connection:
        channel = await connection.channel()
        kind = "fanout" if design == "lock" else "x-consistent-hash"
        exchange = await channel.declare_exchange(
            exchange_name(design, settings.app), kind, durable=True
        )
        for name in queue_names(design, settings.app, settings.buckets):
            queue = await channel.declare_queue(
                name, durable=True, arguments={"x-queue-type": "quorum"}
            )
            await queue.bind(exchange, routing_key="1")
    zk = await asyncio.to_thread(connect_zk, settings, "coordinator")
    try:
        root = zk_root(design, settings.app)
        for child in ("members", "locks"):
            await asyncio.to_thread(zk.ensure_path, f"{root}/{child}")
    finally:
        await asyncio.to_thread(close_zk, zk)


def zk_future(loop: asyncio.AbstractEventLoop, result: Any) -> asyncio.Future[Any]:
    """An asyncio future for a kazoo async result, settled on the loop's thread."""
    future: asyncio.Future[Any] = loop.create_future()

    def settle() -> None:
        if future.cancelled():
            return
        try:
            future.set_result(result.get_nowait())
        except Exception as exc:
            future.set_exception(exc)

    result.rawlink(lambda _: loop.call_soon_threadsafe(settle))
    return future


class Consumer:
    """What both designs share: a robust AMQP connection, a kazoo client, in-flight counting."""

    def __init__(self, settings: Settings, design: str, worker: str) -> None:
        self.settings = settings
        self.design = design
        self.worker = worker
        self.root = zk_root(design, settings.app)
        self.loop = asyncio.get_running_loop()
        self.in_flight = 0
        self.zk: KazooClient
        self.connection: aio_pika.abc.AbstractRobustConnection
        self.channel: aio_pika.abc.AbstractChannel

    async def open(self) -> None:
        self.connection = await aio_pika.connect_robust(
            self.settings.amqp_urls[0],
            client_properties={"connection_name": f"naive-{self.worker}"},
        )
        self.channel = await self.connection.channel()
        await self.channel.set_qos(prefetch_count=PREFETCH)
        self.zk = await asyncio.to_thread(connect_zk, self.settings, "coordinator")

    async def close(self) -> None:
        # Finish what is in hand, as a polite consumer does, for 10 s at most.
        await eventually(lambda: self.in_flight == 0, 10, every=0.1, or_last=True)
        with contextlib.suppress(Exception):
            await self.connection.close()
        await asyncio.to_thread(close_zk, self.zk)

    async def start(self) -> None:
        """Join whatever membership the design has (none by default)."""

    async def follow(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set."""
        raise NotImplementedError

    async def run(self, message: AbstractIncomingMessage, bucket: int) -> None:
        self.in_flight += 1
        try:
            await execute(
                str(message.routing_key),
                message.body,
                message.message_id,
                bucket,
                None,
                bool(message.redelivered),
            )
            await message.ack()
        finally:
            self.in_flight -= 1


class Split(Consumer):
    """Queue i belongs to member i mod n of the sorted live members; re-split on every change."""

    def __init__(self, settings: Settings, design: str, worker: str) -> None:
        super().__init__(settings, design, worker)
        self.names = queue_names(design, settings.app, settings.buckets)
        self.consuming: dict[int, tuple[AbstractQueue, str]] = {}
        self.turns = [asyncio.Lock() for _ in self.names]  # one message at a time per queue
        self.members: asyncio.Queue[list[str]] = asyncio.Queue()

    async def start(self) -> None:
        member = f"{self.root}/members/{self.worker}"

        def join(state: KazooState) -> None:
            if state == KazooState.LOST:
                self.loop.call_soon_threadsafe(self.members.put_nowait, [])
            elif state == KazooState.CONNECTED:
                self.zk.handler.spawn(self._register, member)

        self.zk.add_listener(join)
        self._register(member)
        self.zk.ChildrenWatch(f"{self.root}/members", self._seen)

    def _register(self, member: str) -> None:
        with contextlib.suppress(NodeExistsError, KazooException):
            self.zk.create(member, ephemeral=True)

    def _seen(self, children: list[str]) -> None:
        self.loop.call_soon_threadsafe(self.members.put_nowait, sorted(children))

    async def follow(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            waiter = asyncio.ensure_future(self.members.get())
            await asyncio.wait(
                [waiter, asyncio.ensure_future(stop.wait())], return_when="FIRST_COMPLETED"
            )
            if not waiter.done():
                waiter.cancel()
                break
            await self.resplit(waiter.result())
        await self.resplit([])

    async def resplit(self, members: list[str]) -> None:
        mine = {
            index
            for index in range(len(self.names))
            if members and members[index % len(members)] == self.worker
        }
        log.info("members %s: queues %s", members, sorted(mine))
        for index in set(self.consuming) - mine:
            queue, tag = self.consuming.pop(index)
            try:
                await queue.cancel(tag)  # what was delivered goes on being processed
            except Exception as exc:
                log.warning("cancelling queue %d: %r", index, exc)
        for index in sorted(mine - set(self.consuming)):
            try:
                queue = await self.channel.get_queue(self.names[index])
                tag = await queue.consume(self._handler(index))
            except Exception as exc:
                log.warning("consuming queue %d: %r", index, exc)
            else:
                self.consuming[index] = (queue, tag)

    def _handler(self, index: int) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
        async def handle(message: AbstractIncomingMessage) -> None:
            async with self.turns[index]:
                await self.run(message, index)

        return handle


class Lock(Consumer):
    """Competing consumers on one queue; a message runs only under its key's lock."""

    async def follow(self, stop: asyncio.Event) -> None:
        queue = await self.channel.get_queue(queue_names("lock", self.settings.app, 1)[0])
        tag = await queue.consume(self.handle)
        await stop.wait()
        with contextlib.suppress(Exception):
            await queue.cancel(tag)

    async def handle(self, message: AbstractIncomingMessage) -> None:
        lock = f"{self.root}/locks/{message.routing_key}"
        try:
            await zk_future(self.loop, self.zk.create_async(lock, ephemeral=True))
        except Exception:  # taken, or ZooKeeper unreachable: try again later
            await message.nack(requeue=True)
            return
        try:
            await self.run(message, 0)
        finally:
            with contextlib.suppress(Exception):
                await zk_future(self.loop, self.zk.delete_async(lock))


async def main_async(design: str, worker: str) -> None:
    settings = load_settings()
    consumer: Consumer = (Split if design == "split" else Lock)(settings, design, worker)
    stop = asyncio.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(number, stop.set)
    await consumer.open()
    await consumer.start()
    await consumer.follow(stop)
    await consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="chaos-naive")
    parser.add_argument("design", choices=["split", "lock"])
    parser.add_argument("--worker-id", default=os.environ.get("HASHQ_WORKER_ID", str(os.getpid())))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    asyncio.run(main_async(args.design, args.worker_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
