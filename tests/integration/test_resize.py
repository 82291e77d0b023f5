"""Growing the bucket count online (``hashq resize``) against real RabbitMQ and ZooKeeper: the
property the barrier rests on, checked on the broker's own routing, and a resize under load,
its command killed half way and run again, with a real coordinator and workers: nothing lost,
nothing out of order, never two at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from hashq._io.amqp import connect_amqp
from hashq.errors import MessageUnroutable
from hashq.parked import PARKED_DIGEST_CHARS, ParkedRecord, parked_name
from hashq.placement import bucket_of
from hashq.provision import switch_ring
from hashq.publisher import Outgoing, Publisher
from hashq.records import Paths
from hashq.resizing import ResizePhase
from hashq.settings import Settings
from hashq.topology import Topology
from tests.support.grants import Grants
from tests.support.helpers import hashq, key_buckets
from tests.support.workers import WorkerProcess, read_appended, wait_for_executions
from tools.launcher import Child, child_environment
from tools.polling import eventually

KEYS = [f"entity-{n}" for n in range(3_000)]


async def _where_keys_land(settings: Settings) -> dict[str, int]:
    async with Publisher(settings) as publisher:
        await publisher.publish_many(Outgoing(key, b"x") for key in KEYS)
    return await key_buckets(settings)


async def test_growing_the_ring_moves_keys_only_to_new_buckets(initialized: Settings) -> None:
    """8 to 24 to 64 buckets by the resize's switch, 3,000 keys routed by the broker each time:
    a key stays in its bucket or goes to one of the new ones, never to another old one; and
    where it lands is where the client-side twin says. The first switch is made twice (a
    resizer run again after it switched): the second changes nothing."""
    topology = Topology.from_settings(initialized)
    before = await _where_keys_land(initialized)
    connection = await connect_amqp(initialized, "test-switch")
    async with connection:
        for grown in (24, 64):
            old = topology
            topology = Topology(old.app, grown, old.queue_type, old.delivery_limit)
            await switch_ring(connection, old, topology)
            if grown == 24:
                await switch_ring(connection, old, topology)
            after = await _where_keys_land(initialized.model_copy(update={"buckets": grown}))
            assert after == {key: bucket_of(key, grown) for key in KEYS}
            moved = {key for key in KEYS if after[key] != before[key]}
            assert all(old.buckets <= after[key] < grown for key in moved)
            assert 0.4 < len(moved) / len(KEYS) < 0.9  # about (grown - old) / grown
            before = after


async def _publish_in_order(settings: Settings, keys: int, per_key: int) -> int:
    """Each key's messages one after another, each published again until it lands (a publish
    in the switch is returned); keys at once. Returns how many were returned."""
    returned = 0

    async def one_key(publisher: Publisher, key: str) -> None:
        nonlocal returned
        for seq in range(per_key):
            while True:
                try:
                    await publisher.publish(key, json.dumps({"seq": seq}).encode())
                    break
                except MessageUnroutable:
                    returned += 1
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # so that publishing lasts through the resize

    async with Publisher(settings) as publisher:
        await asyncio.gather(*(one_key(publisher, f"k{n:05d}") for n in range(keys)))
    return returned


def _resize_command(settings: Settings, tmp_path: Path, buckets: int, name: str) -> Child:
    env = child_environment(settings, HASHQ_BUCKETS=str(buckets))
    argv = ["-m", "hashq.admin.cli", "resize"]
    return Child(name, argv, env, tmp_path / f"{name}.log")


async def test_a_resize_under_load_killed_half_way_and_run_again_keeps_every_key_s_order(
    initialized: Settings,
    cluster: Callable[..., WorkerProcess],
    zk_view: Grants,
    tmp_path: Path,
) -> None:
    record = tmp_path / "executions.jsonl"
    cluster("c1")
    for worker in ("w1", "w2"):
        cluster(worker, HASHQ_TEST_DELAY_MS="5", HASHQ_CONCURRENCY="8")
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w1", "w2"}))
    keys, per_key = 200, 60
    publishing = asyncio.ensure_future(_publish_in_order(initialized, keys, per_key))
    await eventually(lambda: len(read_appended(record)) > 1_000, within=60)

    old_epochs = [record.epoch for record in zk_view.records(8).values()]
    first = _resize_command(initialized, tmp_path, 16, "resize-1")
    await eventually(lambda: "markers sent" in first.output(), within=60)
    first.kill()  # kill -9 at the barrier: old buckets still finish what they had
    assert zk_view.resize_phase() is ResizePhase.BARRIER
    status = hashq(initialized, "status")
    assert "resize under way: 8 -> 16 buckets, barrier" in status.stdout, status.stdout[:2000]
    again = _resize_command(initialized, tmp_path, 16, "resize-2")
    assert await asyncio.to_thread(again.wait, 120) == 0, again.output()[-2000:]
    assert "app t has 16 buckets" in again.output()

    returned = await publishing
    expected = {f"k{n:05d}": per_key for n in range(keys)}
    report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    await eventually(lambda: zk_view.all_granted(16, {"w1", "w2"}))
    new_epochs = [record.epoch for b, record in zk_view.records(16).items() if b >= 8]
    assert min(new_epochs) > max(old_epochs), "a moved key's epoch went down: no fencing token"
    new_buckets = {r["bucket"] for r in read_appended(record) if int(r["bucket"]) >= 8}
    assert new_buckets, "no message ran in a new bucket"
    print(f"returned in the switch: {returned}; new buckets used: {sorted(new_buckets)}")


def test_resize_refuses_to_shrink_with_one_line(initialized: Settings) -> None:
    shrink = hashq(initialized, "resize", "--buckets", "4")
    assert shrink.returncode != 0
    assert "shrinking to 4 is not supported" in shrink.stderr
    assert len(shrink.stderr.strip().splitlines()) == 1, shrink.stderr


def test_resize_refuses_while_a_parked_key_would_move_and_names_it(
    initialized: Settings, grants: Grants
) -> None:
    """A parked key whose bucket the new count changes would hold its old bucket's marker until
    it is released: the command refuses before anything begins, naming that key and not one
    that stays. A damaged record (its bucket says so itself) does not stop the check."""
    moving = next(k for k in KEYS if bucket_of(k, 8) != bucket_of(k, 16))
    staying = next(k for k in KEYS if bucket_of(k, 8) == bucket_of(k, 16))
    paths = Paths(initialized.app)
    for key in (moving, staying):
        record = ParkedRecord(key, bucket_of(key, 8), reason="test")
        grants.zk.create(
            f"{paths.parked}/{parked_name(record.bucket, key)}", record.encode(), makepath=True
        )
    grants.zk.create(f"{paths.parked}/0001-{'0' * PARKED_DIGEST_CHARS}", b"{not json")
    refused = hashq(initialized, "resize", "--buckets", "16")
    assert refused.returncode != 0
    assert f"1 parked keys would move to a new bucket ({moving})" in refused.stderr
    assert staying not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert grants.resize_phase() is None  # nothing begun
