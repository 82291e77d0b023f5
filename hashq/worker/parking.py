"""A bucket lease's parked keys at the edge: what ``ParkedKeys``
(``hashq.worker.machine.parked_keys``) asks for, carried out on ZooKeeper (the records, kazoo in a
thread) and RabbitMQ (the parking queues, on the lease's connection). I/O only: every decision,
and why (docs/protocol.md, "Parked keys"), is the machine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.abc import DeliveredMessage
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import DataWatch

from hashq.errors import ServiceUnavailable
from hashq.parked import KEY_HEADER, ParkedRecord, bucket_of_parked_name, parked_name
from hashq.records import Paths
from hashq.topology import Topology
from hashq.worker.jobs import Job, Lease
from hashq.worker.machine import parking as pk
from hashq.worker.machine.lease import LeaseCore
from hashq.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

PARKED_PREFETCH = 16  # parked messages run one at a time: a few ahead is enough
Answer = tuple[pk.Outcome, ParkedRecord | None, int]


class ParkedRecords:
    """The app's parked-key records in ZooKeeper, read and written by kazoo in a thread."""

    def __init__(self, zk: KazooClient, paths: Paths) -> None:
        self._zk = zk
        self._paths = paths
        self._loop = asyncio.get_running_loop()

    def path(self, bucket: int, key: str) -> str:
        return f"{self._paths.parked}/{parked_name(bucket, key)}"

    async def of_bucket(self, bucket: int) -> list[tuple[ParkedRecord, int]]:
        return await asyncio.to_thread(self._of_bucket, bucket)

    def _of_bucket(self, bucket: int) -> list[tuple[ParkedRecord, int]]:
        try:
            names = self._zk.get_children(self._paths.parked)
        except NoNodeError:
            return []  # an app made before parked keys: none yet
        found = []
        for name in names:
            if bucket_of_parked_name(name) != bucket:
                continue
            path = f"{self._paths.parked}/{name}"
            with contextlib.suppress(NoNodeError):
                data, stat = self._zk.get(path)
                found.append((ParkedRecord.read(path, data), stat.version))
        return found

    async def write(self, bucket: int, action: pk.WriteRecord) -> Answer:
        """Carry ``action`` out; every failure is an outcome, none raises."""
        try:
            return await asyncio.to_thread(self._write, self.path(bucket, action.key), action)
        except NoNodeError:
            return pk.Outcome.GONE, None, -1
        except NodeExistsError:
            return pk.Outcome.EXISTS, None, -1
        except BadVersionError:
            return pk.Outcome.CHANGED, None, -1
        except Exception as exc:  # a connection loss: perhaps applied, perhaps not
            log.debug("parked record of bucket %d: %r", bucket, exc)
            return pk.Outcome.FAILED, None, -1

    def _write(self, path: str, action: pk.WriteRecord) -> Answer:
        done = pk.Outcome.DONE
        if action.op is pk.RecordOp.READ:
            data, stat = self._zk.get(path)
            return done, ParkedRecord.decode(data), stat.version
        if action.op is pk.RecordOp.DELETE:
            self._zk.delete(path, action.version)
            return done, None, -1
        assert action.record is not None
        if action.op is pk.RecordOp.CREATE:
            self._zk.create(path, action.record.encode(), makepath=True)
            return done, None, 0
        return done, None, self._zk.set(path, action.record.encode(), action.version).version

    def watch(
        self, path: str, seen: Callable[[ParkedRecord | None, int], None]
    ) -> Callable[[], None]:
        """Tell ``seen`` (on the loop) of every change of the record at ``path``; the returned
        function stops it."""
        stopped = False

        def changed(data: bytes | None, stat: Any, *_: Any) -> bool | None:
            if stopped:
                return False
            record = ParkedRecord.decode(data) if data else None
            self._loop.call_soon_threadsafe(seen, record, stat.version if stat else -1)
            return None

        def stop() -> None:
            nonlocal stopped
            stopped = True

        DataWatch(self._zk, path, changed)
        return stop


class Mover:
    """Publishes parked keys' messages to their parking queues, confirmed, on the worker's
    connection (the one its bucket leases consume on, so that a fence stops it too)."""

    def __init__(self, topology: Topology) -> None:
        self._topology = topology
        self._channel: AbstractChannel | None = None
        self._declared: set[str] = set()

    async def open(self, connection: AbstractConnection) -> None:
        self._channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        self._declared = set()

    async def move(self, job: Job) -> None:
        """Raises unless the broker confirmed it (the original must then not be acknowledged)."""
        channel = self._channel
        if channel is None or channel.is_closed:
            raise ServiceUnavailable("no channel for parked keys' messages")
        queue = self._topology.parking_queue(job.key)
        if queue not in self._declared:
            await channel.declare_queue(
                queue, durable=True, arguments=self._topology.parking_arguments()
            )
            self._declared.add(queue)
        properties = job.delivery.header.properties
        message = aio_pika.Message(
            body=job.delivery.body,
            headers={**(properties.headers or {}), KEY_HEADER: job.key},
            message_id=properties.message_id,
            content_type=properties.content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            await channel.default_exchange.publish(message, routing_key=queue, timeout=30)
        except Exception:
            self._declared.discard(queue)  # perhaps deleted (apps delete): declared again next time
            raise


@dataclass(frozen=True)
class ParkingSite:
    """What the parked keys of every lease of one worker share."""

    records: ParkedRecords
    mover: Mover
    topology: Topology
    dispatch: Callable[[Job], None]  # hands a job to the runners
    metrics: WorkerMetrics


class LeaseParking:
    """Carries out one bucket lease's ``ParkedKeys`` actions; ``act`` after every event."""

    def __init__(
        self,
        lease: Lease,
        core: LeaseCore[Job],
        site: ParkingSite,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        """``changed``: told after every event, so that what waits on the lease (a drain, for
        its parked messages too) sees them counted off, a lost parking channel's included."""
        self._lease, self._core, self._records = lease, core, site.records
        self._changed = changed
        self._metrics = site.metrics
        self._topology = site.topology
        self._dispatch = site.dispatch
        self._connection: AbstractConnection | None = None
        self._channels: dict[str, aiormq.abc.AbstractChannel] = {}  # by key
        self._locks: dict[str, asyncio.Lock] = {}  # acks, then a question, in that order
        self._wanted: dict[str, object] = {}  # the parking channel being opened, by key
        self._watches: dict[str, Callable[[], None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.unread: str | None = None  # why its parked keys could not be read yet, if so

    def start(self, connection: AbstractConnection) -> None:
        """Read the bucket's parked keys (nothing of the bucket goes on until then)."""
        self._connection = connection
        self._spawn(self._load())

    async def _load(self) -> None:
        while not self._closed:
            try:
                found = await self._records.of_bucket(self._lease.bucket)
            except Exception as exc:
                self._unreadable(exc)
                await asyncio.sleep(pk.ASK_AGAIN_SECONDS)
                continue
            if self.unread is not None:
                log.info("bucket %d: its parked keys are read; it goes on", self._lease.bucket)
                self.unread = None
            self._core.parked.load(found)
            self.act()
            return

    def _unreadable(self, exc: Exception) -> None:
        """Said once, and in readiness and ``hashq_buckets_parking_unread`` while it lasts: a
        bucket whose parked keys are unknown starts nothing, since any key may be parked."""
        if self.unread is None:
            log.error(
                "bucket %d: cannot read its parked keys (%s); it starts nothing until they "
                "are read, retrying every %.2f s",
                self._lease.bucket,
                exc,
                pk.ASK_AGAIN_SECONDS,
            )
        else:
            log.debug("bucket %d: reading its parked keys: %r", self._lease.bucket, exc)
        self.unread = str(exc) or repr(exc)

    def act(self) -> None:
        for action in self._core.take():
            if isinstance(action, pk.Dispatch):
                self._dispatch(action.job)
            elif isinstance(action, pk.CutOff):
                action.job.cut_off()  # its runner reports it dropped once its handler stopped
            else:
                self._spawn(self._carry_out(action))
        self._changed()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _carry_out(self, action: pk.Action) -> None:
        if isinstance(action, pk.WriteRecord):
            await self._write(action)
        elif isinstance(action, pk.WatchRecord):
            self._watch(action.key)
        elif isinstance(action, pk.ConsumeParked):
            await self._consume(action.key)
        elif isinstance(action, pk.StopParked):
            await self._stop(action.key)
        elif isinstance(action, pk.AskParked):
            await self._ask(action)

    # ------------------------------------------------------------ records
    async def _write(self, action: pk.WriteRecord) -> None:
        if action.after:
            await asyncio.sleep(action.after)
        if action.op is pk.RecordOp.CREATE and action.why:
            self._metrics.parked[self._lease.bucket, action.why] += 1
            if action.record is not None and not action.record.since:  # for people only
                action = dataclasses.replace(
                    action, record=dataclasses.replace(action.record, since=time.time())
                )
        outcome, record, version = await self._records.write(self._lease.bucket, action)
        self._core.parked.record_result(action.key, action.op, outcome, record, version)
        self.act()

    def _watch(self, key: str) -> None:
        if key not in self._watches and not self._closed:
            path = self._records.path(self._lease.bucket, key)
            self._watches[key] = self._records.watch(
                path, lambda record, version: self._seen(key, record, version)
            )

    def _seen(self, key: str, record: ParkedRecord | None, version: int) -> None:
        if not self._closed:
            self._core.parked.seen(key, record, version)
            self.act()

    # ------------------------------------------------------------ parking queues
    async def _consume(self, key: str) -> None:
        """A channel of its own for ``key``'s parking queue, consuming it; unless the stream
        was stopped (or the lease closed) while the channel was being opened."""
        wanted = self._wanted[key] = object()
        try:
            channel, under = await self._open_parking(key)
            if self._closed or self._wanted.get(key) is not wanted:
                await channel.close()
                return
            self._channels[key], self._locks[key] = under, asyncio.Lock()
            under.closing.add_done_callback(lambda _: self._lost(key, under))
            queue = self._topology.parking_queue(key)
            await under.basic_consume(queue, lambda d: self._delivered(key, d), no_ack=False)
        except Exception as exc:
            log.warning(
                "bucket %d: consuming a parked key's queue failed (%r); retrying",
                self._lease.bucket,
                exc,
            )
            await asyncio.sleep(pk.ASK_AGAIN_SECONDS)
            self._channels.pop(key, None)
            self._core.parked.parking_lost(key)
            self.act()
            return
        self._core.parked.consuming(key)
        self.act()

    async def _open_parking(self, key: str) -> tuple[AbstractChannel, aiormq.abc.AbstractChannel]:
        if self._connection is None or self._connection.is_closed:
            raise ServiceUnavailable("no connection")
        channel = await self._connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=PARKED_PREFETCH)
        await channel.declare_queue(
            self._topology.parking_queue(key),
            durable=True,
            arguments=self._topology.parking_arguments(),
        )
        return channel, await channel.get_underlay_channel()

    async def _delivered(self, key: str, delivery: DeliveredMessage) -> None:
        headers = delivery.header.properties.headers or {}
        frame = delivery.delivery
        assert isinstance(frame, aiormq.spec.Basic.Deliver)
        job = Job(self._lease, delivery, str(headers.get(KEY_HEADER, key)), from_parking=True)
        self._core.parked.delivered(key, frame.delivery_tag or 0, job)
        self.act()

    def _lost(self, key: str, channel: aiormq.abc.AbstractChannel) -> None:
        if self._channels.get(key) is channel and not self._closed:
            del self._channels[key]
            self._core.parked.parking_lost(key)
            self.act()

    async def _stop(self, key: str) -> None:
        self._wanted.pop(key, None)
        channel = self._channels.pop(key, None)
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close()

    async def _ask(self, action: pk.AskParked) -> None:
        if action.after:
            await asyncio.sleep(action.after)
        channel, lock = self._channels.get(action.key), self._locks.get(action.key)
        if channel is None or lock is None:
            return  # its channel went: it is consumed again, and asked again then
        try:
            async with lock:
                answer = await channel.queue_declare(
                    self._topology.parking_queue(action.key), passive=True
                )
        except Exception as exc:
            log.debug("bucket %d: asking a parking queue: %r", self._lease.bucket, exc)
            return  # the channel closed: ``_lost`` takes it from there
        ready, consumers = answer.message_count or 0, answer.consumer_count or 0
        self._core.parked.answered(action.key, ready, consumers)
        self.act()

    def ack(self, job: Job) -> bool:
        """Acknowledge a parked message on its parking channel; False if that channel is gone."""
        channel, lock = self._channels.get(job.key), self._locks.get(job.key)
        if channel is None or lock is None or channel.is_closed:
            return False
        self._spawn(self._send_ack(channel, lock, job.tag))
        return True

    @staticmethod
    async def _send_ack(channel: aiormq.abc.AbstractChannel, lock: asyncio.Lock, tag: int) -> None:
        async with lock:
            with contextlib.suppress(Exception):
                await channel.basic_ack(tag)

    # ------------------------------------------------------------ the lease's end
    async def cancel(self) -> None:
        """The lease drains: nothing more is delivered from the parking queues."""
        for channel in list(self._channels.values()):
            with contextlib.suppress(Exception):
                for tag in list(getattr(channel, "consumers", {})):
                    await channel.basic_cancel(tag)

    async def close(self) -> None:
        """The lease closes: its parking channels close with it (what they held goes back)."""
        self._closed = True
        for stop in self._watches.values():
            stop()
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close()
