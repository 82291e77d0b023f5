"""The topology as data: names, arguments and the ZooKeeper record, without any server."""

from __future__ import annotations

import pytest
from aiormq.exceptions import ConnectionInternalError
from hypothesis import given
from hypothesis import strategies as st

from hashq.errors import ServiceUnavailable, TopologyMismatch
from hashq.provision import _refusals_as_mismatch
from hashq.topology import TOPOLOGY_VERSION, Topology

apps = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True)


@given(app=apps, buckets=st.integers(min_value=1, max_value=4096))
def test_name_order_is_index_order(app: str, buckets: int) -> None:
    topology = Topology(app, buckets, "quorum", 20)
    names = topology.bucket_queues()
    assert sorted(names) == names
    assert len(set(names)) == buckets
    assert [topology.bucket_of_queue(name) for name in names] == list(range(buckets))


@given(app=apps, buckets=st.integers(min_value=1, max_value=4096))
def test_record_round_trips(app: str, buckets: int) -> None:
    topology = Topology(app, buckets, "classic", 5)
    assert Topology.from_record(topology.to_record()) == topology


def test_out_of_range_bucket_is_refused() -> None:
    topology = Topology("a", 8, "quorum", 20)
    with pytest.raises(IndexError):
        topology.bucket_queue(8)
    with pytest.raises(ValueError, match="not a bucket queue"):
        topology.bucket_of_queue("hashq.other.b0001")


def test_bucket_arguments_by_queue_type() -> None:
    quorum = Topology("a", 8, "quorum", 7).bucket_arguments()
    assert quorum["x-single-active-consumer"] is True
    assert quorum["x-delivery-limit"] == 7
    assert quorum["x-dead-letter-exchange"] == "hashq.a.dlx"
    assert quorum["x-dead-letter-strategy"] == "at-least-once"
    classic = Topology("a", 8, "classic", 7).bucket_arguments()
    assert classic["x-single-active-consumer"] is True
    assert "x-delivery-limit" not in classic


def test_mismatch_names_every_difference() -> None:
    ours = Topology("a", 16, "classic", 20)
    with pytest.raises(TopologyMismatch) as caught:
        ours.require_same(Topology("a", 8, "quorum", 20))
    assert "buckets 16 vs 8" in str(caught.value)
    assert "queue_type 'classic' vs 'quorum'" in str(caught.value)
    ours.require_same(Topology("a", 16, "classic", 20))


def test_newer_topology_version_is_refused() -> None:
    newer = Topology("a", 8, "quorum", 20, version=TOPOLOGY_VERSION + 1)
    with pytest.raises(TopologyMismatch, match="upgrade hashq"):
        Topology("a", 8, "quorum", 20).require_same(newer)


def test_unreadable_record_is_a_clear_error() -> None:
    with pytest.raises(TopologyMismatch, match="unreadable topology record"):
        Topology.from_record(b"{not json")
    with pytest.raises(TopologyMismatch, match="unreadable topology record"):
        Topology.from_record(b'{"app": "a"}')


async def test_a_broker_error_while_declaring_is_one_line_saying_to_run_again() -> None:
    """What a RabbitMQ cluster that is still forming answered in a test: a connection-level
    error, which used to reach the command line as a traceback."""
    refusal = ConnectionInternalError(
        541, "INTERNAL_ERROR - Cannot declare a queue 'hashq.t.dead': feature flag is disabled"
    )
    with pytest.raises(ServiceUnavailable) as caught:
        async with _refusals_as_mismatch(Topology("t", 8, "quorum", 20)):
            raise refusal
    message = str(caught.value)
    assert "\n" not in message
    assert "feature flag is disabled" in message and "running the command again" in message
