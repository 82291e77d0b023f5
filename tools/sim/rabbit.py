"""A model of the RabbitMQ behaviour hashq relies on, and of the behaviour that hurts it.

- Bucket queues keep publish order; a message returned by a closed channel goes back to its
  place (before everything published after it) and counts as a delivery: past the quorum
  delivery limit it is dead-lettered.
- Single active consumer: the first registered consumer of a queue gets its messages, up to its
  prefetch; when it is cancelled or its channel closes, the next one becomes active at once. A
  cancelled consumer keeps what it was delivered until it acknowledges it or its channel closes.
- ``consumer_timeout``: a delivery unacknowledged for that long closes its channel.
- A server-sent ``basic.cancel``; node restarts (every connection closed; queues durable).
- Exclusive queues belong to one connection (the workers' liveness queues).
- A passive declare says how many messages are ready and how many consumers the queue has,
  counting a cancelled one until what it holds is settled or returned (a quorum queue's
  answer); a queue without a leader answers (0, 0).
- The management API lists a connection only some time (up to its lag) after it opened, and
  may be slow or fail.
- Heartbeats: a partition longer than the heartbeat makes each side give the connection up, at
  its own moment.
- The event exchange: every connection the broker's end closes is announced by name to the
  listeners (``on_closed``), whatever closed it, a node restart included; each listener
  decides whether it hears it (its own link, the node being up).
- The ring: with ``jump`` (a run that resizes), a key goes where the real ring sends it
  (``hashq.placement``) among the ``routing`` buckets it is bound to; ``unroute`` unbinds the
  entry exchange (a publish is returned) and ``route`` binds it again over more buckets.
  Without, a stand-in hash over the buckets (the seeds drawn before resizes keep theirs).
"""

from __future__ import annotations

import bisect
import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from hashq.placement import bucket_of as ring_bucket_of
from tools.sim.net import Link, Pipe
from tools.sim.world import World

ROUTING_LAG = 0.05  # seconds a publish may trail a later request on another channel (busy)
CONSUMER_TIMEOUT_REASON = "PRECONDITION_FAILED - delivery acknowledgement on channel {} timed out"


@dataclass
class Msg:
    number: int  # publish order across the broker: a queue's order
    key: str
    seq: int  # per key, from 1
    returned: int = 0  # times a closed channel handed it back (the quorum delivery count)
    marker: int = 0  # a resize's marker (``hashq.resizing``): the bucket count it grows to

    def __lt__(self, other: Msg) -> bool:
        return self.number < other.number


class Client(Protocol):
    """What the broker tells the client end of a connection (after the network's delay)."""

    def delivered(self, channel: int, tag: int, msg: Msg, redelivered: bool) -> None: ...
    def channel_closed(self, channel: int, reason: str) -> None: ...
    def consumer_cancelled(self, channel: int) -> None: ...
    def connection_closed(self, reason: str) -> None: ...


@dataclass(eq=False)
class Channel:
    connection: Connection
    number: int
    queue: Queue
    prefetch: int
    epoch: int
    next_tag: int = 1
    unacked: dict[int, Msg] = field(default_factory=dict)
    consuming: bool = True
    open: bool = True


@dataclass(eq=False)
class Queue:
    name: str
    ready: list[Msg] = field(default_factory=list)  # sorted by number
    consumers: list[Channel] = field(default_factory=list)  # registration order; [0] is active
    owner: Connection | None = None  # of an exclusive queue


class Connection:
    """One AMQP connection: a client end (``client_open``), a broker end (``open``), and two
    pipes between them."""

    def __init__(self, broker: Broker, name: str, client: Client, link: Link) -> None:
        self.broker = broker
        self.name = name
        self.client = client
        self.up = Pipe(broker.world, link)
        self.down = Pipe(broker.world, link)
        self.open = True  # on the broker's side
        self.client_open = True
        self.channels: dict[int, Channel] = {}
        # Late, but never later than the lag the coordinators are told (their contract).
        lag = broker.listing_lag * broker.world.rng.uniform(0.5, 1.0)
        self.listed_at = broker.world.now + lag
        self.link = link
        self._waiting: dict[int, Callable[[str], None]] = {}  # requests not answered yet
        self._requests = 0

    # ------------------------------------------------------------ the client's calls
    def consume(
        self, channel: int, queue: str, prefetch: int, done: Callable[[str], None], epoch: int
    ) -> None:
        """Open ``channel``, set its prefetch and consume ``queue``; ``done("")`` or an error.
        ``epoch`` is the simulation's label of the consumer, for the invariants only."""
        self._call(lambda: self.broker.consume(self, channel, queue, prefetch, epoch), done)

    def declare_exclusive(self, queue: str, done: Callable[[str], None]) -> None:
        self._call(lambda: self.broker.declare_exclusive(self, queue), done)

    def sync(self, channel: int, done: Callable[[str], None]) -> None:
        """A request on ``channel`` that changes nothing (``basic.qos`` again): answered after
        every earlier frame on it was taken in; an error if the channel is gone."""
        self._call(lambda: self.broker.channel_open(self, channel), done)

    def ping(self, done: Callable[[str], None]) -> None:
        """A request that changes nothing (a worker keeps its ``BrokerContact`` with it)."""
        self._call(lambda: "", done)

    def stat(self, queue: str, done: Callable[[tuple[int, int] | None], None]) -> None:
        """A passive declare of ``queue`` (``Broker.stat``); None if it failed."""
        answer: list[tuple[int, int] | None] = [None]

        def ask() -> str:
            answer[0] = self.broker.stat(queue)
            return "" if answer[0] is not None else f"NOT_FOUND - no queue '{queue}'"

        self._call(ask, lambda error: done(None if error else answer[0]))

    def publish_parked(self, queue: str, msg: Msg, done: Callable[[str], None]) -> None:
        """Declare ``queue`` (durable) and publish a copy of ``msg`` to it, confirmed. Published
        on a channel of its own, it reaches the queue up to ``ROUTING_LAG`` after a later
        request on another channel (a channel is a process of its own in RabbitMQ)."""
        lag = self.broker.world.rng.uniform(0.0, ROUTING_LAG)
        self._call(lambda: self.broker.publish_parked(queue, msg), done, lag)

    def declare(self, queue: str, done: Callable[[str], None]) -> None:
        """Declare a durable queue (nothing if it exists)."""
        self._call(lambda: self.broker.declare(queue), done)

    def dead_letter(self, msg: Msg, done: Callable[[str], None]) -> None:
        """Publish ``msg`` to the dead-letter exchange, confirmed."""
        self._call(lambda: self.broker.dead_letter(msg), done)

    def ack(self, channel: int, tag: int, multiple: bool) -> None:
        if self.client_open:
            self.up.send(lambda: self.broker.ack(self, channel, tag, multiple))

    def cancel(self, channel: int, done: Callable[[str], None]) -> None:
        self._call(lambda: self.broker.cancel(self, channel), done)

    def close_channel(self, channel: int, done: Callable[[str], None]) -> None:
        self._call(lambda: self.broker.close_channel(self, channel), done)

    def close(self) -> None:
        """The client closes its end; the broker closes its own when the frame arrives."""
        if self.client_open:
            self.client_open = False
            self.up.send(lambda: self.broker.close_connection(self, "closed by the client"))
            self._fail_waiting()

    def _call(
        self, request: Callable[[], str], done: Callable[[str], None], lag: float = 0.0
    ) -> None:
        """A request and its answer; once the client's end closes, every request still
        waiting fails ("connection closed"), as aiormq's do."""
        if not self.client_open:
            self.broker.world.after(0, lambda: done("connection closed"))
            return
        self._requests += 1
        number = self._requests
        self._waiting[number] = done

        def answered(answer: str) -> None:
            waiting = self._waiting.pop(number, None)
            if waiting is not None:
                waiting(answer)

        def at_broker() -> None:
            answer = request() if self.open else "connection closed"
            self.down.send(lambda: answered(answer))

        def routed_later() -> None:  # taken in while the connection was open: routed anyway
            if not self.open:
                at_broker()
                return

            def route() -> None:
                answer = request()
                self.down.send(lambda: answered(answer))

            self.broker.world.after(lag, route)

        self.up.send(routed_later if lag else at_broker)

    def _fail_waiting(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for done in waiting.values():
            self.broker.world.after(0, lambda done=done: done("connection closed"))  # type: ignore[misc]

    # ------------------------------------------------------------ the client end gives up
    def lost_by_client(self, reason: str) -> None:
        """The client end gives the connection up (heartbeats missed, or the broker closed it):
        its socket closes, which the broker learns once the network lets it through."""
        if self.client_open:
            self.client_open = False
            self.client.connection_closed(reason)
            self._fail_waiting()
            self.up.send(lambda: self.broker.close_connection(self, "client closed the socket"))


class Broker:
    def __init__(
        self,
        world: World,
        buckets: int,
        *,
        prefetch_cap: int = 1000,
        delivery_limit: int = 20,
        consumer_timeout: float = 0.0,
        heartbeat: float = 10.0,
        listing_lag: float = 2.0,
        return_lag: float = 0.0,
        jump: bool = False,
    ) -> None:
        self.world = world
        self.buckets = buckets  # bucket queues declared
        self.initial_buckets = buckets  # what ``hashq init`` made
        self.routing = buckets  # the ring's size (0: the entry exchange is unbound)
        self.jump = jump
        self.queues = {self.bucket_queue(b): Queue(self.bucket_queue(b)) for b in range(buckets)}
        self.delivery_limit = delivery_limit
        self.consumer_timeout = consumer_timeout
        self.heartbeat = heartbeat
        self.listing_lag = listing_lag
        self.return_lag = return_lag
        self.dying: list[Channel] = []  # of closed connections, not yet ended by their queue
        self.prefetch_cap = prefetch_cap
        self.connections: list[Connection] = []
        self.dead: list[Msg] = []
        self.up = True
        self.api_failing = False
        self.api_delay = 0.0
        self._published = 0
        self.moved = 0  # messages published to parking queues
        self.on_consumers: Callable[[str, list[int]], None] | None = None
        self.on_connect: Callable[[str], None] | None = None  # the name of each new connection
        self.on_closed: list[Callable[[str], None]] = []  # the event exchange's subscribers

    @staticmethod
    def bucket_queue(bucket: int) -> str:
        return f"b{bucket:04d}"

    def bucket_of(self, key: str) -> int:
        if self.jump:
            return _jump(key, self.routing)
        return zlib.crc32(key.encode()) % self.buckets

    # ------------------------------------------------------------ the ring (a resize)
    def declare_buckets(self, count: int) -> None:
        for bucket in range(self.buckets, count):
            self.queues.setdefault(self.bucket_queue(bucket), Queue(self.bucket_queue(bucket)))
        self.buckets = max(self.buckets, count)

    def unroute(self) -> None:
        self.routing = 0

    def route(self, count: int) -> None:
        assert self.jump and count <= self.buckets
        self.routing = count

    def publish_marker(self, bucket: int, new: int) -> bool:
        """A resize's marker straight into a bucket queue (the default exchange)."""
        if not self.up:
            return False
        self._published += 1
        queue = self.queues[self.bucket_queue(bucket)]
        queue.ready.append(Msg(self._published, "", 0, marker=new))
        self._dispatch(queue)
        return True

    # ------------------------------------------------------------ connections
    def connect(self, name: str, client: Client, link: Link) -> Connection | None:
        """A new connection, or None if the node is down or unreachable."""
        if not self.up or not link.up:
            return None
        connection = Connection(self, name, client, link)
        self.connections.append(connection)
        if self.on_connect is not None:
            self.on_connect(name)
        return connection

    def close_connection(self, connection: Connection, reason: str) -> None:
        """The broker's end closes: what its channels held goes back; exclusive queues go."""
        if not connection.open:
            return
        connection.open = False
        for channel in list(connection.channels.values()):
            self._end_channel_later(channel)
        for name, queue in list(self.queues.items()):
            if queue.owner is connection:
                del self.queues[name]
        self.connections = [c for c in self.connections if c.open]
        connection.down.send(lambda: connection.lost_by_client(reason))
        for listener in list(self.on_closed):
            listener(connection.name)

    def partition(self, link: Link) -> None:
        """Cut ``link``; each side of each of its connections gives up after a heartbeat or
        two, unless it heals first."""
        link.cut()
        for connection in [c for c in self.connections if c.link is link]:
            self._give_up_later(connection, link)

    def _give_up_later(self, connection: Connection, link: Link) -> None:
        rng = self.world.rng

        def broker_side() -> None:
            if not link.up:
                self.close_connection(connection, "missed heartbeats from client")

        def client_side() -> None:
            if not link.up:
                connection.lost_by_client("missed heartbeats from server")

        self.world.after(self.heartbeat * rng.uniform(1.0, 2.0), broker_side)
        self.world.after(self.heartbeat * rng.uniform(1.0, 2.0), client_side)

    def restart(self, downtime: float) -> None:
        """The node stops (every connection closed; the client sees it at once) and comes back
        after ``downtime``; queues and their messages are durable."""
        self.up = False
        for connection in list(self.connections):
            self.close_connection(connection, "CONNECTION_FORCED - broker shutdown")
            connection.lost_by_client("connection reset")

        def back() -> None:
            self.up = True

        self.world.after(downtime, back)

    # ------------------------------------------------------------ the broker's side of calls
    def consume(
        self, connection: Connection, number: int, name: str, prefetch: int, epoch: int
    ) -> str:
        queue = self.queues.get(name)
        if queue is None:
            return f"NOT_FOUND - no queue '{name}'"
        channel = Channel(connection, number, queue, min(prefetch, self.prefetch_cap), epoch)
        connection.channels[number] = channel
        queue.consumers.append(channel)
        if self.on_consumers is not None:
            # A channel of a dead connection that the queue has not ended yet runs nothing.
            live = [c.epoch for c in queue.consumers if c.connection.open]
            self.on_consumers(name, live)
        self._dispatch(queue)
        return ""

    def declare_exclusive(self, connection: Connection, name: str) -> str:
        queue = self.queues.get(name)
        if queue is not None and queue.owner is not connection:
            return f"RESOURCE_LOCKED - cannot obtain exclusive access to queue '{name}'"
        self.queues[name] = queue or Queue(name, owner=connection)
        return ""

    def channel_open(self, connection: Connection, number: int) -> str:
        channel = connection.channels.get(number)
        return "" if channel is not None and channel.open else "CHANNEL_ERROR - channel closed"

    def exists(self, name: str) -> bool:
        return name in self.queues

    def stat(self, name: str) -> tuple[int, int] | None:
        """A passive declare's answer, as a quorum queue gives it: ready messages, and the
        consumers that consume or still hold a delivery (a cancelled one holding messages is
        counted). A queue whose dead channel it has not ended yet has no leader: it answers
        (0, 0), as ``rabbit_quorum_queue:stat/2`` does when its question fails. None: the node
        is down (the declare fails)."""
        queue = self.queues.get(name)
        if queue is None or not self.up:
            return None
        if any(channel.queue is queue for channel in self.dying):
            return 0, 0
        holders = [
            channel
            for connection in self.connections
            for channel in connection.channels.values()
            if channel.queue is queue and (channel.consuming or channel.unacked)
        ]
        return len(queue.ready), len(holders)

    def ack(self, connection: Connection, number: int, tag: int, multiple: bool) -> None:
        channel = connection.channels.get(number)
        if channel is None or not channel.open or not connection.open:
            return
        tags = [t for t in channel.unacked if t <= tag] if multiple else [tag]
        for acked in tags:
            channel.unacked.pop(acked, None)
        self._dispatch(channel.queue)

    def cancel(self, connection: Connection, number: int) -> str:
        channel = connection.channels.get(number)
        if channel is not None and channel.consuming:
            channel.consuming = False
            channel.queue.consumers.remove(channel)
            self._dispatch(channel.queue)
        return ""

    def close_channel(self, connection: Connection, number: int) -> str:
        channel = connection.channels.get(number)
        if channel is not None:
            self._end_channel(channel)
        return ""

    def cancel_from_server(self, channel: Channel) -> None:
        """A server-sent ``basic.cancel`` (the queue's leader moved, say)."""
        if channel.consuming and channel.open:
            self.cancel(channel.connection, channel.number)
            connection = channel.connection
            connection.down.send(lambda: connection.client.consumer_cancelled(channel.number))

    def _end_channel_later(self, channel: Channel) -> None:
        """A bucket queue learns of a dead connection's channel on its own time: at once where
        the queue lives on the connection's node, up to ``return_lag`` later in a cluster
        whose queue leader was on a failed node and is elected again first (the connection
        and its exclusive queues are gone meanwhile; tests/e2e/test_cluster.py found it). Until
        then the channel keeps what it was delivered and, if still consuming, stays the
        queue's active consumer."""
        lag = self.world.rng.uniform(0.0, self.return_lag) if self.return_lag else 0.0
        if lag <= 0:
            self._end_channel(channel)
            return
        self.dying.append(channel)

        def ended() -> None:
            self.dying.remove(channel)
            self._end_channel(channel)

        self.world.after(lag, ended)

    def _end_channel(self, channel: Channel) -> None:
        if not channel.open:
            return
        channel.open = False
        channel.connection.channels.pop(channel.number, None)
        if channel.consuming:
            channel.consuming = False
            channel.queue.consumers.remove(channel)
        self._return(channel.queue, list(channel.unacked.values()))
        channel.unacked.clear()
        self._dispatch(channel.queue)

    def _return(self, queue: Queue, messages: list[Msg]) -> None:
        for msg in messages:
            msg.returned += 1
            if msg.returned >= self.delivery_limit:
                self.dead.append(msg)
            else:
                bisect.insort(queue.ready, msg)

    def _dispatch(self, queue: Queue) -> None:
        while queue.ready and queue.consumers:
            channel = queue.consumers[0]
            if len(channel.unacked) >= channel.prefetch or channel in self.dying:
                return  # a dying active consumer: the queue has no leader yet, it sends nothing
            msg = queue.ready.pop(0)
            tag = channel.next_tag
            channel.next_tag += 1
            channel.unacked[tag] = msg
            self._deliver(channel, tag, msg)

    def _deliver(self, channel: Channel, tag: int, msg: Msg) -> None:
        connection = channel.connection
        redelivered = msg.returned > 0
        connection.down.send(
            lambda: (
                connection.client.delivered(channel.number, tag, msg, redelivered)
                if connection.client_open
                else None
            )
        )
        if self.consumer_timeout > 0:
            self.world.after(self.consumer_timeout, lambda: self._check_timeout(channel, tag, msg))

    def _check_timeout(self, channel: Channel, tag: int, msg: Msg) -> None:
        # A dying channel's process went with its connection: no channel is left to time out.
        if channel.open and channel not in self.dying and channel.unacked.get(tag) is msg:
            self._end_channel(channel)
            connection = channel.connection
            reason = CONSUMER_TIMEOUT_REASON.format(channel.number)
            connection.down.send(lambda: connection.client.channel_closed(channel.number, reason))

    # ------------------------------------------------------------ publishing
    def publish(self, key: str, seq: int) -> bool:
        """Route to the key's bucket queue; False (not confirmed) while the node is down or
        the entry exchange is unbound (returned to the mandatory publisher)."""
        if not self.up or not self.routing:
            return False
        self._published += 1
        queue = self.queues[self.bucket_queue(self.bucket_of(key))]
        queue.ready.append(Msg(self._published, key, seq))
        self._dispatch(queue)
        return True

    # ------------------------------------------------------------ parked keys
    def publish_parked(self, name: str, msg: Msg) -> str:
        """Declare the parking queue ``name`` (durable) and append a copy of ``msg`` to it:
        a queue's order is the order of its own publishes."""
        if not self.up:
            return "connection closed"
        queue = self.queues.setdefault(name, Queue(name))
        self.moved += 1
        self._published += 1
        queue.ready.append(Msg(self._published, msg.key, msg.seq))
        self._dispatch(queue)
        return ""

    def declare(self, name: str) -> str:
        self.queues.setdefault(name, Queue(name))
        return ""

    def dead_letter(self, msg: Msg) -> str:
        self.dead.append(msg)
        return ""

    # ------------------------------------------------------------ the management API
    def listed_connections(self) -> list[str] | None:
        """Names the API lists now (None: the call failed)."""
        if self.api_failing or not self.up:
            return None
        now = self.world.now
        return [c.name for c in self.connections if c.open and c.listed_at <= now]

    def force_close(self, name: str) -> bool:
        if self.api_failing or not self.up:
            return False
        for connection in list(self.connections):
            if connection.name == name:
                self.close_connection(connection, "CONNECTION_FORCED - fenced")
        return True

    def backlog(self) -> int:
        """Messages not yet acknowledged, in queues or checked out."""
        ready = sum(len(q.ready) for q in self.queues.values())
        out = sum(len(ch.unacked) for c in self.connections for ch in c.channels.values())
        return ready + out + sum(len(channel.unacked) for channel in self.dying)


@functools.lru_cache(maxsize=1 << 16)
def _jump(key: str, buckets: int) -> int:
    return ring_bucket_of(key, buckets)
