"""What every simulated process shares: it can be frozen (SIGSTOP: nothing of it runs, every
callback into it waits), resumed, and killed (nothing of it runs again)."""

from __future__ import annotations

from collections.abc import Callable

from tools.sim.net import Link
from tools.sim.world import World


class Process:
    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.alive = True
        self.stranded = False  # cut off for good at the end: no earlier fault's heal undoes it
        self.frozen_since: float | None = None
        self._waiting: list[Callable[[], None]] = []
        self.amqp_link = Link(world)
        self.zk_link = Link(world)

    def run(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` in this process now, or when it is resumed; never once it died."""
        if not self.alive:
            return
        if self.frozen_since is not None:
            self._waiting.append(callback)
            return
        callback()

    def later(self, delay: float, callback: Callable[[], None]) -> None:
        self.world.after(delay, lambda: self.run(callback))

    def bound(self, callback: Callable[..., None]) -> Callable[..., None]:
        """``callback`` as something a server may call: it runs inside this process."""
        return lambda *args: self.run(lambda: callback(*args))

    def freeze(self) -> None:
        if self.alive and self.frozen_since is None:
            self.frozen_since = self.world.now

    def resume(self) -> None:
        if self.frozen_since is None:
            return
        paused = self.world.now - self.frozen_since
        self.frozen_since = None
        self.resumed(paused)
        waiting, self._waiting = self._waiting, []
        for callback in waiting:
            self.run(callback)

    def resumed(self, paused: float) -> None:
        """Told first after a freeze (the process's own watchdog)."""

    def kill(self) -> None:
        self.alive = False
        self._waiting.clear()
