"""The fixtures hashq ships for its users' tests (``hashq.pytest_plugin``, registered through the
``pytest11`` entry point, so this file imports nothing of it): a fresh app on real servers."""

from __future__ import annotations

from hashq.publisher import Publisher
from hashq.settings import WorkerSettings
from tests.support.helpers import key_buckets


async def test_each_test_gets_an_app_of_its_own_on_the_real_servers(
    hashq_app: WorkerSettings,
) -> None:
    assert hashq_app.app == "test" and "/hashq-test-" in hashq_app.amqp_url
    async with Publisher(hashq_app) as publisher:
        await publisher.publish("user-1", {"n": 1})
    assert set(await key_buckets(hashq_app)) == {"user-1"}  # nothing of any other test
