"""The chaos run's network: every process it starts reaches RabbitMQ (AMQP), the management API
and ZooKeeper through links of its own (``tools.chaos.proxy.Link``), so that a fault can cut,
blackhole or slow one process's link to one server while everything else goes on."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from hashq.settings import Settings
from tools.chaos.proxy import Link

SERVERS = ("amqp", "management", "zookeeper")


def _address(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def _through(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the link's, credentials and path kept."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = (credentials + "@" if credentials else "") + f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _zk_address(hosts: str) -> tuple[tuple[str, int], str]:
    """The first ZooKeeper server of ``hosts`` and the chroot (the chaos run uses one server)."""
    servers, slash, chroot = hosts.partition("/")
    host, _, port = servers.split(",")[0].rpartition(":")
    return (host or "127.0.0.1", int(port or 2181)), slash + chroot


class Network:
    """Links by process name and server."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        zk, self._chroot = _zk_address(settings.zk_hosts)
        self._upstreams = {
            "amqp": _address(settings.amqp_urls[0], 5672),
            "management": _address(settings.management_urls[0], 15672),
            "zookeeper": zk,
        }
        self.links: dict[str, dict[str, Link]] = {}

    async def attach(self, process: str) -> dict[str, str]:
        """Links for ``process``, listening: the ``HASHQ_`` settings that make it use them."""
        links = {server: Link(f"{process}/{server}", self._upstreams[server]) for server in SERVERS}
        for link in links.values():
            await link.start()
        self.links[process] = links
        settings = self._settings
        return {
            "HASHQ_AMQP_URL": _through(settings.amqp_urls[0], links["amqp"].port),
            "HASHQ_MANAGEMENT_URL": _through(settings.management_urls[0], links["management"].port),
            "HASHQ_ZK_HOSTS": f"127.0.0.1:{links['zookeeper'].port}{self._chroot}",
        }

    async def close(self) -> None:
        for links in self.links.values():
            for link in links.values():
                await link.close()
