"""ReadyJobs: as few runner wakes as keep every job moving, and no job left behind."""

from __future__ import annotations

import asyncio

from hashq.worker.ready import ReadyJobs


class _Runners:
    """Runner tasks like ``hashq.worker.runners``'s, counting their wakes; a handler waits
    ``waits`` loop passes."""

    def __init__(self, ready: ReadyJobs[int], count: int, waits: int) -> None:
        self.ready, self.waits = ready, waits
        self.done: list[int] = []
        self.wakes = 0
        self.running = 0
        self.most_running = 0
        self.tasks = [asyncio.ensure_future(self._run()) for _ in range(count)]

    async def _run(self) -> None:
        while True:
            job = self.ready.take()
            if job is None:
                await self.ready.wait()
                self.wakes += 1
                continue
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            for _ in range(self.waits):
                await asyncio.sleep(0)
            self.running -= 1
            self.done.append(job)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _burst(count: int, runners: int, waits: int) -> _Runners:
    ready: ReadyJobs[int] = ReadyJobs()
    pool = _Runners(ready, runners, waits)
    await asyncio.sleep(0)  # every runner idle
    for job in range(count):
        ready.put(job)
    for _ in range(count * (waits + 2) + 10):
        await asyncio.sleep(0)
    await pool.stop()
    return pool


async def test_a_burst_whose_handlers_never_wait_costs_two_wakes() -> None:
    pool = await _burst(100, runners=16, waits=0)
    assert sorted(pool.done) == list(range(100))
    assert pool.wakes <= 2


async def test_handlers_that_wait_run_side_by_side_up_to_the_runners() -> None:
    pool = await _burst(100, runners=16, waits=3)
    assert sorted(pool.done) == list(range(100))
    assert pool.most_running == 16


async def test_a_runner_woken_then_cancelled_passes_its_wake_on() -> None:
    ready: ReadyJobs[int] = ReadyJobs()
    pool = _Runners(ready, 2, waits=0)
    await asyncio.sleep(0)
    ready.put(1)  # wakes the first idle runner ...
    pool.tasks[0].cancel()  # ... which is cancelled before it runs
    for _ in range(5):
        await asyncio.sleep(0)
    assert pool.done == [1]
    await pool.stop()


async def test_a_job_put_back_is_taken_first_and_wakes_no_one() -> None:
    ready: ReadyJobs[str] = ReadyJobs()
    ready.put("a")
    ready.put("b")
    assert ready.take() == "a"
    ready.put_back("a")
    assert [ready.take(), ready.take(), ready.take()] == ["a", "b", None]
