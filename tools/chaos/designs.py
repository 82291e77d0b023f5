"""The designs a chaos run puts under the same workload and faults: hashq, and the two naive
designs of ``tools.chaos.naive``. Each says how to set itself up, how to start one of its consumers,
where publishers send, and which queues hold what is left at the end."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hashq.admin.apps import remove, remove_app
from hashq.parked import KEY_HEADER
from hashq.provision import ensure_topology
from hashq.settings import Settings
from hashq.topology import Topology
from tools.chaos import naive
from tools.queues import take_all


@dataclass(frozen=True)
class Design:
    name: str
    title: str

    @property
    def coordinated(self) -> bool:
        """Whether the design has coordinators (whose leader a fault can kill)."""
        return self.name == "hashq"

    def clients(self) -> tuple[str, str]:
        """The two publishers' clients: hashq's publisher only where hashq's topology is."""
        return ("hashq", "plain") if self.name == "hashq" else ("plain", "plain")

    def exchange(self, settings: Settings) -> str:
        if self.name == "hashq":
            return Topology.from_settings(settings).exchange
        return naive.exchange_name(self.name, settings.app)

    def worker(self, name: str) -> list[str]:
        if self.name == "hashq":
            # Every other worker runs its handlers in threads, which a drain cannot cancel.
            threads = int(name.rsplit("-", 1)[-1]) % 2 == 0
            handler = "record_in_thread" if threads else "record"
            return ["-m", "hashq.worker.cli", f"tools.chaos.handler:{handler}", "--worker-id", name]
        return ["-m", "tools.chaos.naive", self.name, "--worker-id", name]

    async def prepare(self, settings: Settings) -> None:
        if self.name == "hashq":
            await ensure_topology(settings)
        else:
            await naive.declare(settings, self.name)

    def queues(self, settings: Settings) -> list[str]:
        if self.name == "hashq":
            return Topology.from_settings(settings).bucket_queues()
        return naive.queue_names(self.name, settings.app, settings.buckets)

    def dead_letter_queue(self, settings: Settings) -> str | None:
        if self.name == "hashq":
            return Topology.from_settings(settings).dead_letter_queue
        return None

    async def remove(self, settings: Settings) -> None:
        if self.name == "hashq":
            await remove_app(settings)
        else:
            await remove(
                settings,
                self.queues(settings),
                [self.exchange(settings)],
                naive.zk_root(self.name, settings.app),
            )


DESIGNS = {
    design.name: design
    for design in (
        Design("hashq", "hashq"),
        Design("split", "hash exchange, re-split"),
        Design("lock", "one queue, key lock"),
    )
}


async def leftovers(settings: Settings, queues: list[str]) -> set[tuple[str, int]]:
    """Empty ``queues`` (at the end of a run) and return the (key, seq) of what they held: a
    parking queue's messages (``hashq.parked``) carry their key in a header."""
    found: set[tuple[str, int]] = set()
    for name in queues:
        for message in await take_all(settings, name):
            key = (message.headers or {}).get(KEY_HEADER) or message.routing_key  # parked: its key
            found.add((str(key), int(json.loads(message.body)["seq"])))
    return found
