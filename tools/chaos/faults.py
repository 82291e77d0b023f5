"""The fault schedule of a chaos run: each fault drawn from the seed, carried out on the run's
processes or servers, and logged with its time (``at``: seconds into the run; ``wall``: epoch
seconds, to line up with the execution records)."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from hashq._io.zk import close_zk, connect_zk
from hashq.records import Leadership, Paths
from hashq.settings import Settings
from tools import SERVICES_SCRIPT, say
from tools.chaos.designs import Design
from tools.launcher import Fleet

SESSION_SECONDS = 4.0
FAULT_KINDS = ("kill", "start", "term", "stop", "leader", "rabbitmq", "zookeeper")  # Chaos.kinds


class Chaos:
    """Draws and carries out faults; ``log`` lists what was done."""

    def __init__(
        self,
        fleet: Fleet,
        design: Design,
        settings: Settings,
        seed: int,
        schedule: list[str] | None = None,
    ) -> None:
        self.fleet = fleet
        self.design = design
        self.settings = settings
        self.rng = random.Random(seed)
        # Fault kinds to carry out in turn, and then no more; None: each drawn from the seed.
        self.schedule = None if schedule is None else list(schedule)
        self.log: list[dict[str, Any]] = []
        self._started = time.monotonic()
        self._serial = 0

    def note(self, fault: str, target: str = "", took_effect: bool = True) -> dict[str, Any]:
        """Log a fault once it was carried out, saying whether it took effect (a signal to a
        process that had exited, or a restart that failed, did not)."""
        entry = {
            "at": round(time.monotonic() - self._started, 2),
            "wall": time.time(),
            "fault": fault,
            "target": target,
            "took_effect": took_effect,
        }
        self.log.append(entry)
        say(f"fault: {fault} {target}".rstrip() + ("" if took_effect else " (NO EFFECT)"))
        return entry

    def start(self, kind: str) -> str:
        """Start a worker or a coordinator of the design; returns its name."""
        self._serial += 1
        name = f"{kind}-{self._serial}"
        if kind == "coordinator":
            return self.fleet.start(name, "-m", "hashq_coordinator.cli", "--coordinator-id", name)
        return self.fleet.start(name, *self.design.worker(name))

    def kinds(self) -> dict[str, Callable[[], Any]]:
        """Every fault, by the name ``--faults`` gives it (``FAULT_KINDS``)."""
        return {
            "kill": self.kill_worker,
            "start": self.start_worker,
            "term": self.term_worker,
            "stop": self.stop_worker,
            "leader": self.kill_leader,
            "rabbitmq": lambda: self.restart("rabbitmq"),
            "zookeeper": lambda: self.restart("zookeeper"),
        }

    async def one(self) -> None:
        if self.schedule is None:
            kind = self.rng.choice(FAULT_KINDS)
        elif self.schedule:
            kind = self.schedule.pop(0)
        else:
            return  # the schedule is done: the run goes on without faults
        result = self.kinds()[kind]()
        if asyncio.iscoroutine(result):
            await result

    def _victim(self) -> str | None:
        workers = self.fleet.alive("worker")
        if len(workers) <= 1:
            self.start_worker()
            return None
        return self.rng.choice(workers)

    def kill_worker(self) -> None:
        if victim := self._victim():
            child = self.fleet.processes[victim]
            sent = child.signal(signal.SIGKILL)
            self.note("kill -9 worker", victim, sent and child.wait(5) is not None)

    def start_worker(self) -> None:
        self.note("start worker", self.start("worker"))

    def term_worker(self) -> None:
        if victim := self._victim():
            self.note("SIGTERM worker", victim, self.fleet.signal(victim, signal.SIGTERM))

    async def stop_worker(self) -> None:
        if victim := self._victim():
            entry = self.note("SIGSTOP worker", victim, self.fleet.processes[victim].freeze())
            await asyncio.sleep(SESSION_SECONDS * 2.5)
            self.fleet.signal(victim, signal.SIGCONT)
            entry["until"] = time.time()
            say(f"SIGCONT {victim}")

    async def kill_leader(self) -> None:
        if not self.design.coordinated:
            say("kill -9 leader: this design has no coordinator")
            return
        leader = await asyncio.to_thread(read_leader, self.settings)
        if leader and leader in self.fleet.processes:
            child = self.fleet.processes[leader]
            sent = child.signal(signal.SIGKILL)
            self.note("kill -9 leader", leader, sent and child.wait(5) is not None)
            self.start("coordinator")
        else:
            self.note("kill -9 leader", str(leader), took_effect=False)

    async def restart(self, service: str) -> None:
        began = time.time()
        ok = await asyncio.to_thread(services, "restart", service)
        if not ok:  # a harness fault, not the design's: bring the service back
            await asyncio.to_thread(services, "up", service)
        entry = self.note(f"restart {service}", took_effect=ok)
        entry["wall"], entry["until"] = began, time.time()


def services(command: str, service: str) -> bool:
    done = subprocess.run(["bash", str(SERVICES_SCRIPT), command, service], capture_output=True)
    if done.returncode != 0:
        say(f"services.sh {command} {service}: {done.stderr.decode(errors='replace').strip()}")
    return done.returncode == 0


def read_leader(settings: Settings) -> str | None:
    try:
        zk = connect_zk(settings, "coordinator")
    except Exception:
        return None
    try:
        return Leadership.decode(zk.get(Paths(settings.app).leader)[0]).leader
    except Exception:
        return None
    finally:
        close_zk(zk)
