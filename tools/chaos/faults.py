"""The fault schedule of a chaos run: each fault drawn from the seed, carried out on the run's
processes, servers or links (``tools.chaos.network``), and logged with its time (``at``: seconds
into the run; ``wall``: epoch seconds, to line up with the execution records; ``until``: when a
fault that lasts was healed)."""

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
from tools.broker_env import rabbit_eval, set_rabbit_env
from tools.chaos.clock import Clocks
from tools.chaos.designs import Design
from tools.chaos.network import Network
from tools.launcher import Fleet

SESSION_SECONDS = 4.0
DRAIN_SECONDS = 2.0  # shorter than the publishers' holds (tools.chaos.publish)
PROCESS_FAULTS = ("kill", "start", "term", "stop", "leader", "rabbitmq", "zookeeper")
ROLLING = (
    "rolling-workers",  # each worker in turn: SIGTERM, a new one started, then the next
    "rolling-coordinators",  # the same for each coordinator
)
NETWORK_FAULTS = (
    "cut-zk",  # a worker cut off ZooKeeper; its AMQP connection stays up
    "cut-amqp",  # a worker cut off RabbitMQ; its ZooKeeper session stays up
    "cut-both",  # a worker cut off both
    "leader-cut-zk",  # the leader cut off ZooKeeper; it still reaches the management API
    "leader-cut-management",  # the leader cut off the management API only
    "halfopen-amqp",  # a worker's AMQP connection swallows every byte, both ways, unclosed
    "halfopen-zk",  # the same for its ZooKeeper connection
    "slow",  # 0.2 to 2 s added to every link of one worker
)
CLOCK_FAULTS = (
    "clock-worker",  # one worker's wall clock stepped by plus or minus 1 to 10 minutes
    "clock-leader",  # the same for the leading coordinator
)
FAULT_KINDS = PROCESS_FAULTS + ROLLING + NETWORK_FAULTS + CLOCK_FAULTS  # Chaos.kinds


class Chaos:
    """Draws and carries out faults; ``log`` lists what was done."""

    def __init__(
        self,
        fleet: Fleet,
        network: Network,
        clocks: Clocks,
        design: Design,
        settings: Settings,
        seed: int,
        schedule: list[str] | None = None,
        broker_settings: dict[str, int] | None = None,
    ) -> None:
        self.fleet = fleet
        self.network = network
        self.clocks = clocks
        self.design = design
        self.settings = settings
        self.rng = random.Random(seed)
        # Fault kinds to carry out in turn, and then no more; None: each drawn from the seed.
        self.schedule = None if schedule is None else list(schedule)
        # Set in RabbitMQ at run time (tools.broker_env), so set again after each restart of it.
        self.broker_settings = broker_settings or {}
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

    async def start(self, kind: str) -> str:
        """Start a worker or a coordinator of the design, on links of its own; its name."""
        self._serial += 1
        name = f"{kind}-{self._serial}"
        env = {**await self.network.attach(name), **self.clocks.environment(name)}
        if kind == "coordinator":
            argv = ["-m", "hashq_coordinator.cli", "--coordinator-id", name]
        else:
            argv = self.design.worker(name)
        return self.fleet.start(name, *argv, env=env)

    def kinds(self) -> dict[str, Callable[[], Any]]:
        """Every fault, by the name ``--faults`` gives it (``FAULT_KINDS``)."""
        return {
            "kill": self.kill_worker,
            "start": self.start_worker,
            "term": self.term_worker,
            "stop": self.stop_worker,
            "leader": self.kill_leader,
            "rabbitmq": lambda: self.restart("rabbitmq"),
            "rolling-workers": lambda: self.rolling("worker"),
            "rolling-coordinators": lambda: self.rolling("coordinator"),
            "zookeeper": lambda: self.restart("zookeeper"),
            "cut-zk": lambda: self.cut_worker("zookeeper"),
            "cut-amqp": lambda: self.cut_worker("amqp"),
            "cut-both": lambda: self.cut_worker("zookeeper", "amqp"),
            "leader-cut-zk": lambda: self.cut_leader("zookeeper"),
            "leader-cut-management": lambda: self.cut_leader("management"),
            "halfopen-amqp": lambda: self.half_open("amqp"),
            "halfopen-zk": lambda: self.half_open("zookeeper"),
            "slow": self.slow_worker,
            "clock-worker": self.step_worker_clock,
            "clock-leader": self.step_leader_clock,
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

    async def _victim(self) -> str | None:
        workers = self.fleet.alive("worker")
        if len(workers) <= 1:
            await self.start_worker()
            return None
        return self.rng.choice(workers)

    async def kill_worker(self) -> None:
        if victim := await self._victim():
            child = self.fleet.processes[victim]
            sent = child.signal(signal.SIGKILL)
            exited = sent and await asyncio.to_thread(child.wait, 5) is not None
            self.note("kill -9 worker", victim, exited)

    async def start_worker(self) -> None:
        self.note("start worker", await self.start("worker"))

    async def term_worker(self) -> None:
        if victim := await self._victim():
            self.note("SIGTERM worker", victim, self.fleet.signal(victim, signal.SIGTERM))

    async def stop_worker(self) -> None:
        if victim := await self._victim():
            frozen = await asyncio.to_thread(self.fleet.processes[victim].freeze)
            entry = self.note("SIGSTOP worker", victim, frozen)
            await asyncio.sleep(SESSION_SECONDS * 2.5)
            self.fleet.signal(victim, signal.SIGCONT)
            entry["until"] = time.time()
            say(f"SIGCONT {victim}")

    async def rolling(self, kind: str) -> None:
        """A rolling restart under load: each of ``kind`` in turn stopped with SIGTERM (waiting
        for its exit, as Kubernetes does up to its grace period) and replaced by a new one."""
        if kind == "coordinator" and not self.design.coordinated:
            say("rolling coordinators: this design has no coordinator")
            return
        began = time.time()
        old = self.fleet.alive(kind)
        for name in old:
            self.fleet.signal(name, signal.SIGTERM)
            await asyncio.to_thread(self.fleet.processes[name].wait, 4 * DRAIN_SECONDS + 10)
            await self.start(kind)
            await asyncio.sleep(SESSION_SECONDS)  # the new one registers and is granted work
        entry = self.note(f"rolling restart {kind}s", ",".join(old), took_effect=bool(old))
        entry["wall"], entry["until"] = began, time.time()

    async def kill_leader(self) -> None:
        if not self.design.coordinated:
            say("kill -9 leader: this design has no coordinator")
            return
        leader = await asyncio.to_thread(read_leader, self.settings)
        if leader and leader in self.fleet.processes:
            child = self.fleet.processes[leader]
            sent = child.signal(signal.SIGKILL)
            exited = sent and await asyncio.to_thread(child.wait, 5) is not None
            self.note("kill -9 leader", leader, exited)
            await self.start("coordinator")
        else:
            self.note("kill -9 leader", str(leader), took_effect=False)

    # ------------------------------------------------------------ links
    def _lasting(self) -> float:
        """How long a link fault lasts: from half a session (the client only suspends) to three
        (its session expires and the coordinator fences it)."""
        return self.rng.uniform(0.5, 3.0) * SESSION_SECONDS

    async def cut_worker(self, *servers: str) -> None:
        if victim := await self._victim():
            await self._cut(f"cut {'+'.join(servers)} worker", victim, servers)

    async def cut_leader(self, server: str) -> None:
        if leader := await self._leader(f"cut {server} leader"):
            await self._cut(f"cut {server} leader", leader, (server,))

    async def _leader(self, fault: str) -> str | None:
        """The leading coordinator of this run, or None (noted, without effect)."""
        if not self.design.coordinated:
            say(f"{fault}: this design has no coordinator")
            return None
        leader = await asyncio.to_thread(read_leader, self.settings)
        if leader and leader in self.network.links:
            return leader
        self.note(fault, str(leader), took_effect=False)
        return None

    async def _cut(self, fault: str, target: str, servers: tuple[str, ...]) -> None:
        links = self.network.links[target]
        others = [server for server in links if server not in servers]
        entry = self.note(fault, target, self.fleet.processes[target].alive)
        entry["open_elsewhere"] = {server: links[server].connections for server in others}
        for server in servers:
            links[server].cut()
        await self._heal_after(entry, *(links[server].heal for server in servers))

    async def half_open(self, server: str) -> None:
        if victim := await self._victim():
            link = self.network.links[victim][server]
            entry = self.note(f"half-open {server} worker", victim, link.connections > 0)
            link.blackhole()
            await self._heal_after(entry, link.heal)

    async def slow_worker(self) -> None:
        if victim := await self._victim():
            delay = round(self.rng.uniform(0.2, 2.0), 2)
            entry = self.note("slow links worker", victim)
            entry["delay_s"] = delay
            links = list(self.network.links[victim].values())
            for link in links:
                link.slow(delay)
            await self._heal_after(entry, *(link.heal for link in links))

    # ------------------------------------------------------------ clocks
    async def step_worker_clock(self) -> None:
        if victim := await self._victim():
            await self._step_clock("clock step worker", victim)

    async def step_leader_clock(self) -> None:
        if leader := await self._leader("clock step leader"):
            await self._step_clock("clock step leader", leader)

    async def _step_clock(self, fault: str, target: str) -> None:
        seconds = self.rng.choice((-1, 1)) * round(self.rng.uniform(60, 600))
        entry = self.note(fault, target, self.clocks.step(target, seconds))
        entry["step_s"] = seconds
        await self._heal_after(entry, lambda: self.clocks.heal(target))

    async def _heal_after(self, entry: dict[str, Any], *heals: Callable[[], None]) -> None:
        lasting = self._lasting()
        entry["lasting_s"] = round(lasting, 2)
        await asyncio.sleep(lasting)
        for heal in heals:
            heal()
        entry["until"] = time.time()
        say(f"healed {entry['fault']} {entry['target']}")

    async def restart(self, service: str) -> None:
        began = time.time()
        ok = await asyncio.to_thread(services, "restart", service)
        if not ok:  # a harness fault, not the design's: bring the service back
            await asyncio.to_thread(services, "up", service)
        if service == "rabbitmq" and self.broker_settings:
            await asyncio.to_thread(set_rabbit_env, rabbit_eval, self.broker_settings)
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
