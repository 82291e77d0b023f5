"""Several RabbitMQ nodes named in one setting: a connection or management call goes on past
a node that does not answer, and says in one line which nodes failed when none does."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from hashq._io.amqp import connect_amqp
from hashq._io.management import Management
from hashq.errors import ServiceUnavailable
from hashq.settings import Settings


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, then closed, so nothing else took it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    yield port


def _at_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit(":", 1)[0] + f":{port}"))


def _with_dead_node_first(settings: Settings, port: int) -> Settings:
    return settings.model_copy(
        update={
            "amqp_url": f"{_at_port(settings.amqp_url, port)},{settings.amqp_url}",
            "management_url": f"{_at_port(settings.management_url, port)},"
            f"{settings.management_url}",
        }
    )


async def test_a_connection_goes_past_a_node_that_does_not_answer(
    settings: Settings, dead_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(random, "randrange", lambda n: 0)  # the dead node is tried first
    two_nodes = _with_dead_node_first(settings, dead_port)
    connection = await connect_amqp(two_nodes, "test-two-nodes")
    try:
        assert not connection.is_closed
        assert connection.transport is not None
        assert connection.transport.connection.url.port == urlsplit(settings.amqp_url).port
    finally:
        await connection.close()


async def test_no_node_answering_is_one_line_naming_each(
    settings: Settings, dead_port: int
) -> None:
    nowhere = settings.model_copy(
        update={
            "amqp_url": f"amqp://guest:s3cret@127.0.0.1:{dead_port}/,"
            f"amqp://guest:s3cret@127.0.0.1:{dead_port}/"
        }
    )
    with pytest.raises(ServiceUnavailable) as caught:
        await connect_amqp(nowhere, "test-nowhere")
    message = str(caught.value)
    assert message.startswith("no RabbitMQ node answered: ")
    assert message.count(f"127.0.0.1:{dead_port}") == 2
    assert "\n" not in message and "s3cret" not in message


def test_management_goes_past_a_node_that_does_not_answer(
    settings: Settings, dead_port: int
) -> None:
    management = Management(_with_dead_node_first(settings, dead_port))
    assert management.queue_depths() == {}  # the test's fresh vhost, through the live node
    with pytest.raises(ServiceUnavailable, match=f"127.0.0.1:{dead_port}"):
        Management(
            settings.model_copy(update={"management_url": f"http://127.0.0.1:{dead_port}"})
        ).connections()


def test_a_management_url_with_credentials_in_it_works(settings: Settings) -> None:
    """``http://user:password@host:port`` is the usual form: the credentials go into the
    Authorization header, not into the host the request is sent to."""
    user, password = settings.management_credentials
    parts = urlsplit(settings.management_url)
    with_credentials = urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.netloc}"))
    management = Management(settings.model_copy(update={"management_url": with_credentials}))
    assert isinstance(management.connections(), list)
