"""The network between a process and a server: each TCP connection is two FIFO pipes, and a
partition of a process from a server holds every frame on its pipes until it heals (TCP
retransmits), or until one side gives the connection up (a heartbeat or session timeout)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from tools.sim.world import World

FRAME_GAP = 0.00005  # seconds between back-to-back frames on one pipe


class Pipe:
    """One direction of one connection: frames arrive in the order sent, after a latency."""

    def __init__(self, world: World, link: Link) -> None:
        self._world = world
        self._link = link
        self._frames: deque[Callable[[], None]] = deque()
        self._pumping = False
        self.open = True
        link.pipes.append(self)

    def send(self, frame: Callable[[], None]) -> None:
        if not self.open:
            return
        self._frames.append(frame)
        self._pump(self._world.latency())

    def close(self) -> None:
        """Frames not yet arrived are lost."""
        self.open = False
        self._frames.clear()

    def _pump(self, delay: float) -> None:
        if not self._pumping and self._frames and self._link.up:
            self._pumping = True
            self._world.after(delay, self._arrive)

    def _arrive(self) -> None:
        self._pumping = False
        if not self.open or not self._frames:
            return
        if not self._link.up:
            return  # held: ``Link.heal`` pumps again
        frame = self._frames.popleft()
        frame()
        self._pump(FRAME_GAP)

    def resume(self) -> None:
        self._pump(self._world.latency())


class Link:
    """Whether a process reaches a server; every pipe of their connections follows it."""

    def __init__(self, world: World) -> None:
        self._world = world
        self.up = True
        self.pipes: list[Pipe] = []

    def cut(self) -> None:
        self.up = False

    def heal(self) -> None:
        self.up = True
        self.pipes = [pipe for pipe in self.pipes if pipe.open]
        for pipe in self.pipes:
            pipe.resume()
