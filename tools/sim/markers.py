"""A simulated worker's edge for resize markers (``hashq.resizing``): what
``hashq.worker.bucket_lease`` does with a marker ``LeaseCore.passable`` hands out. The
acknowledgements of everything before it go out, a request on the same channel proves the
broker took them in (the channel is still open), the passed node is created in ZooKeeper, and
only then is the marker acknowledged. If the channel goes meanwhile, the marker goes back to
the queue with it, and the bucket's next owner passes it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from hashq.resizing import passed_name
from tools.sim.process import Process
from tools.sim.zoo import NodeExists, NoNode, ZkClient, ZkError, ZooKeeper

if TYPE_CHECKING:
    from tools.sim.leases import Job, LeaseRunner, SimLease

RETRY_SECONDS = 0.25


class SimMarkers:
    def __init__(self, process: Process, client: ZkClient, resize_path: str) -> None:
        self._process = process
        self._client = client
        self._path = resize_path
        self.runner: LeaseRunner | None = None
        self.skip_sync = False  # a mutation: the passed node written before the acks are in

    def act(self, lease: SimLease) -> None:
        for job in lease.core.passable():
            self._flush(job)

    def _live(self, lease: SimLease) -> bool:
        runner = self.runner
        return runner is not None and runner.leases.get(lease.number) is lease and not lease.closed

    def _flush(self, job: Job) -> None:
        lease, runner = job.lease, self.runner
        assert runner is not None
        runner.send_acks(lease)
        if self.skip_sync:
            self._say(job)
            return
        lease.connection.sync(lease.channel, self._process.bound(lambda e: self._synced(job, e)))

    def _synced(self, job: Job, error: str) -> None:
        if not error and self._live(job.lease):
            self._say(job)

    def _say(self, job: Job) -> None:
        path = f"{self._path}/{passed_name(job.marker, job.lease.bucket)}"

        def create(zk: ZooKeeper, _: int) -> None:
            # NodeExists: passed before; NoNode: no resize (a copy of an earlier one's marker).
            with contextlib.suppress(NodeExists, NoNode):
                zk.create(path, b"", makepath=False)

        def done(answer: Any) -> None:
            if not self._live(job.lease):
                return
            if isinstance(answer, ZkError):
                self._process.later(RETRY_SECONDS, lambda: self._say(job))
                return
            assert self.runner is not None
            self.runner.marker_passed(job)

        self._client.call(create, self._process.bound(done))
