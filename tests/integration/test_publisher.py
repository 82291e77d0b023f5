"""The confirmed publisher against a real broker: every outcome explicit, nothing lost silently."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest
from aio_pika.abc import AbstractIncomingMessage

from hashq._io.amqp import connect_amqp
from hashq._io.management import Management
from hashq.errors import (
    BatchPublishError,
    InvalidMessage,
    MessageNacked,
    MessageUnroutable,
    PublishUnconfirmed,
    TopologyMismatch,
)
from hashq.placement import bucket_of
from hashq.provision import ensure_topology
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from hashq.sync_publisher import SyncPublisher
from hashq.topology import Topology
from tests.support.helpers import close_connection_named, key_buckets, wait_for_connection
from tests.support.services import Endpoints
from tools.queues import take_all


async def test_confirmed_message_is_in_its_bucket_with_its_properties(
    initialized: Settings,
) -> None:
    async with Publisher(initialized) as publisher:
        message_id = await publisher.publish(
            "user-1", b"hello", headers={"trace": "abc"}, message_id="m-1"
        )
    assert message_id == "m-1"
    found = await _all_messages(initialized)
    assert len(found) == 1
    (message,) = found
    assert message.routing_key == "user-1"
    assert message.body == b"hello"
    assert message.headers["trace"] == "abc"
    assert message.message_id == "m-1"
    assert message.delivery_mode == 2  # persistent


async def test_one_key_stays_in_one_bucket_in_publish_order(initialized: Settings) -> None:
    messages = [Outgoing(f"user-{n % 50}", f"{n}".encode()) for n in range(2000)]
    async with Publisher(initialized, max_in_flight=200) as publisher:
        ids = await publisher.publish_many(messages)
    assert len(ids) == len(set(ids)) == 2000
    per_key: dict[str, list[int]] = {}
    buckets: dict[str, int] = {}
    for index, name in enumerate(Topology.from_settings(initialized).bucket_queues()):
        for message in await take_all(initialized, name):
            assert message.routing_key is not None
            assert buckets.setdefault(message.routing_key, index) == index
            per_key.setdefault(message.routing_key, []).append(int(message.body))
    assert sum(len(seq) for seq in per_key.values()) == 2000
    for sequence in per_key.values():
        assert sequence == sorted(sequence)


@pytest.mark.parametrize("key", ["", "x" * 256, "é" * 128])
async def test_bad_keys_are_refused_before_sending(initialized: Settings, key: str) -> None:
    async with Publisher(initialized) as publisher:
        with pytest.raises(InvalidMessage, match="key"):
            await publisher.publish(key, b"body")
    assert sum((await key_buckets(initialized)).values()) == 0


async def test_publishing_without_topology_says_run_init(settings: Settings) -> None:
    with pytest.raises(TopologyMismatch, match="hashq init"):
        async with Publisher(settings):
            pass


async def _delete_ring(settings: Settings) -> None:
    """What a broker restart does to the transient ring."""
    connection = await connect_amqp(settings, "test-delete-ring")
    async with connection:
        channel = await connection.channel()
        await channel.exchange_delete("hashq.t.ring")


async def test_publisher_rebuilds_a_vanished_ring(initialized: Settings) -> None:
    async with Publisher(initialized) as publisher:
        await _delete_ring(initialized)
        with pytest.raises(MessageUnroutable, match="routed the message to no queue"):
            await publisher.publish("user-1", b"lost?", message_id="returned")
        # The return made the publisher rebuild the ring; publishing again lands.
        await publisher.publish("user-1", b"again", message_id="landed")
    queued = [m.message_id for m in await _all_messages(initialized)]
    assert queued == ["landed"]


async def test_a_publisher_with_too_few_buckets_builds_the_app_s_ring_not_a_small_one(
    initialized: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The app has 8 buckets; a publisher set to 4 (older than a resize) finds the ring gone (a
    broker restart). It once built a 4-bucket ring, which a worker's start later extended to
    8: keys changed bucket twice and lost their order. It builds the app's 8, and says so."""
    await _delete_ring(initialized)
    too_few = initialized.model_copy(update={"buckets": 4})
    async with Publisher(too_few) as publisher:
        await publisher.publish_many(Outgoing(f"user-{n}", b"x") for n in range(200))
    assert "has 8 bucket queues, more than the 4 of this process's HASHQ_BUCKETS" in caplog.text
    mapping = await key_buckets(initialized)
    assert mapping == {f"user-{n}": bucket_of(f"user-{n}", 8) for n in range(200)}


@pytest.fixture
def writer(endpoints: Endpoints, vhost: str) -> Iterator[str]:
    """A user that may publish to the test's vhost but not configure it."""
    admin = Management(
        Settings(amqp_url=endpoints.amqp_url, management_url=endpoints.management_url)
    )
    name = f"writer-{vhost}"
    admin.request("PUT", f"/api/users/{name}", {"password": "pw", "tags": ""})
    admin.request(
        "PUT",
        f"/api/permissions/{quote(vhost, safe='')}/{name}",
        {"configure": "", "write": ".*", "read": ""},
    )
    yield name
    admin.request("DELETE", f"/api/users/{name}", missing_ok=True)


async def test_unroutable_messages_raise_for_each(
    initialized: Settings, endpoints: Endpoints, vhost: str, writer: str
) -> None:
    """A publisher that may not configure (write permission only) cannot rebuild the ring: every
    message is reported, none is confirmed."""
    await _delete_ring(initialized)
    limited = initialized.model_copy(
        update={"amqp_url": f"amqp://{writer}:pw@{_host_port(endpoints)}/{quote(vhost, safe='')}"}
    )
    async with Publisher(limited) as publisher:
        with pytest.raises(MessageUnroutable, match="routed the message to no queue"):
            await publisher.publish("user-1", b"x")
        with pytest.raises(BatchPublishError) as caught:
            await publisher.publish_many(Outgoing(f"k{n}", b"x") for n in range(10))
    assert [failure.index for failure in caught.value.failures] == list(range(10))
    assert all(isinstance(f.error, MessageUnroutable) for f in caught.value.failures)
    assert caught.value.confirmed == []
    assert await _all_messages(initialized) == []


def _host_port(endpoints: Endpoints) -> str:
    return endpoints.amqp_url.split("@", 1)[1].rstrip("/")


async def _all_messages(settings: Settings) -> list[AbstractIncomingMessage]:
    return [
        message
        for name in Topology.from_settings(settings).bucket_queues()
        for message in await take_all(settings, name)
    ]


def _reject_publish_policy(management: Management, pattern: str) -> None:
    management.request(
        "PUT",
        f"/api/policies/{quote(management.vhost, safe='')}/full",
        {
            "pattern": pattern,
            "apply-to": "queues",
            "definition": {"max-length": 0, "overflow": "reject-publish"},
        },
    )


async def _wait_until_nacked(publisher: Publisher) -> None:
    # A policy reaches the queue asynchronously; probe until it bites.
    for attempt in range(100):
        try:
            await publisher.publish("probe", b"x", message_id=f"probe-{attempt}")
        except MessageNacked:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("policy never applied")


@pytest.fixture
async def classic(settings: Settings) -> Settings:
    """Classic bucket queues: with max-length 0 they refuse every publish, while quorum queues
    accept one message past the limit before they refuse."""
    classic = settings.model_copy(update={"queue_type": "classic"})
    await ensure_topology(classic)
    return classic


async def test_nacked_message_raises(classic: Settings, management: Management) -> None:
    _reject_publish_policy(management, r"^hashq\.t\.b")
    async with Publisher(classic) as publisher:
        await _wait_until_nacked(publisher)
        with pytest.raises(MessageNacked, match="refused") as caught:
            await publisher.publish("user-7", b"x", message_id="nacked-1")
    assert caught.value.message_id == "nacked-1"
    assert caught.value.key == "user-7"


async def test_batch_reports_exactly_the_nacked_messages(
    classic: Settings, management: Management
) -> None:
    initialized = classic
    probe_bucket = await _bucket_of(initialized, "probe")
    _reject_publish_policy(management, rf"^hashq\.t\.b{probe_bucket:04d}$")
    keys = [f"user-{n}" for n in range(400)]
    async with Publisher(initialized) as publisher:
        await _wait_until_nacked(publisher)
        with pytest.raises(BatchPublishError) as caught:
            await publisher.publish_many(Outgoing(key, b"x", message_id=key) for key in keys)
    failed = {keys[failure.index] for failure in caught.value.failures}
    queued = set(await key_buckets(initialized))
    assert failed and queued
    assert set(caught.value.confirmed) == queued
    assert failed | queued == set(keys)
    assert not failed & queued
    assert all(isinstance(f.error, MessageNacked) for f in caught.value.failures)


async def _bucket_of(settings: Settings, key: str) -> int:
    async with Publisher(settings) as publisher:
        await publisher.publish(key, b"x")
    return (await key_buckets(settings))[key]


async def test_connection_dropped_mid_batch(initialized: Settings, management: Management) -> None:
    """Everything reported confirmed is queued; everything else is reported failed."""
    total = 30_000
    confirmed_so_far = asyncio.Event()

    def on_confirmed(count: int) -> None:
        if count >= 2_000:
            confirmed_so_far.set()

    publisher = Publisher(initialized)
    await publisher.connect()
    await wait_for_connection(management, publisher.connection_name)
    batch = asyncio.ensure_future(
        publisher.publish_many(
            (Outgoing(f"user-{n % 997}", b"x", message_id=str(n)) for n in range(total)),
            on_confirmed=on_confirmed,
        )
    )
    await asyncio.wait_for(confirmed_so_far.wait(), 60)
    await close_connection_named(management, publisher.connection_name)
    with pytest.raises(BatchPublishError) as caught:
        await batch

    failures = caught.value.failures
    confirmed = set(caught.value.confirmed)
    assert failures, "the batch should not have finished before the connection was closed"
    assert len(confirmed) + len(failures) == total
    assert all(isinstance(f.error, PublishUnconfirmed) for f in failures)
    queued_ids = {message.message_id for message in await _all_messages(initialized)}
    assert confirmed <= queued_ids, "a message reported confirmed is missing from the queues"

    # The same publisher opens a new connection for the next message.
    await publisher.publish("after", b"x", message_id="after")
    await publisher.close()
    assert "after" in await key_buckets(initialized)


def test_the_synchronous_publisher_keeps_each_thread_s_order_across_threads(
    initialized: Settings,
) -> None:
    """Eight threads, no event loop of their own, one publisher: each thread's key in the
    order that thread published it (a test function without async, as Django code is)."""
    with SyncPublisher(initialized) as publisher:

        def publish_in_order(thread: int) -> list[str]:
            return [publisher.publish(f"thread-{thread}", f"{n}") for n in range(100)]

        with ThreadPoolExecutor(8) as pool:
            ids = [id_ for batch in pool.map(publish_in_order, range(8)) for id_ in batch]
        assert len(set(ids)) == 800
        assert len(publisher.publish_many(Outgoing("batch", b"x") for _ in range(50))) == 50
    per_key: dict[str, list[int]] = {}
    for name in Topology.from_settings(initialized).bucket_queues():
        for message in asyncio.run(take_all(initialized, name)):
            if message.routing_key != "batch":
                per_key.setdefault(str(message.routing_key), []).append(int(message.body))
    assert per_key == {f"thread-{thread}": list(range(100)) for thread in range(8)}


def test_the_synchronous_publisher_raises_what_the_async_one_raises(
    settings: Settings, classic: Settings, management: Management
) -> None:
    unknown = SyncPublisher(settings.model_copy(update={"app": "never-initialized"}))
    try:
        with pytest.raises(TopologyMismatch, match="hashq init"):
            unknown.connect()
    finally:
        unknown.close()
    with SyncPublisher(classic) as publisher:
        with pytest.raises(InvalidMessage, match="key"):
            publisher.publish("", b"x")
        _reject_publish_policy(management, r"^hashq\.t\.b")
        with pytest.raises(MessageNacked, match="refused"):
            for attempt in range(100):  # a policy reaches the queue asynchronously
                publisher.publish("probe", b"x", message_id=f"probe-{attempt}")
                time.sleep(0.1)
