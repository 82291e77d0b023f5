"""``make mutations``: each rule of the protocol taken out in turn, and the simulation run on
what is left (docs/guarantees.md, "Mutations").

    python -m tools.sim.mutations --seeds 240 --jobs 2             # every mutation
    python -m tools.sim.mutations --seeds 40 finding-4 same-epoch  # some of them
    python -m tools.sim.mutations --list                           # names, what each takes out

Each mutation is one exact replacement of text in one file. It is made in a copy of the source
tree (the packages ``python -m tools.sim.run`` imports from here) in a fresh temporary folder, and
``python -m tools.sim.run`` runs there, so that it imports the mutated copy. One line per mutation:
how many seeds failed, the lowest, and the kinds of violation seen (the text before the first
colon, with worker and queue names such as ``w3`` and ``b0007`` read as ``*``). ``--markdown``
writes the table of docs/guarantees.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What ``python -m tools.sim.run`` imports, copied with the repository's layout so that a
# mutation's path is the same in the copy; ``tools/__init__.py`` makes ``tools`` a package.
COPIED = (
    "hashq",
    "coordinator/hashq_coordinator",
    "tools/sim",
    "tools/__init__.py",
    "tools/checker.py",
    "tools/executions.py",
)
VIOLATION = re.compile(r"^seed (\d+): VIOLATION (.*)$", re.MULTILINE)
NAMES = re.compile(r"\b[wb]\d+\b")  # a worker (w3) or a bucket queue (b0007)
# What a simulated handler thread checks before it begins its job.
# When the leader takes a fenced owner's contact bound to have lapsed (``View._contact_lapses``).
_CONTACT_LAPSES = "return min(*fenced, self.closed_at.get(owner, math.inf)) + contact"
THREAD_CHECK = (
    "if self.paused or not job.lease.core.may_start() or not self._heard(job.lease.connection):"
)


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str  # what is taken out, as the table says it
    path: str  # relative to the source root
    old: str  # must occur exactly once in ``path``
    new: str
    also: tuple[tuple[str, str], ...] = ()  # further (old, new) in ``path``, when a rule has two


@dataclass(frozen=True)
class Budget:
    seeds: int
    first: int
    jobs: int
    steps: int
    parking: bool = True  # False: seeds as drawn before parked keys (``--no-parking``)


@dataclass(frozen=True)
class Result:
    mutation: Mutation
    failed: tuple[int, ...] = ()
    kinds: Counter[str] = field(default_factory=Counter)
    error: str = ""


WORKER = "hashq/worker/machine/core.py"
LEASES = "hashq/worker/machine/leases.py"
BOOK = "coordinator/hashq_coordinator/machine/fencebook.py"

MUTATIONS = (
    Mutation(
        "finding-1",
        "finding 1: a fence covers every later connection of its incarnation",
        BOOK,
        '            if self._sightings.get(incarnation, Sighting("", 0))'
        ".connection == connection\n",
        "",
    ),
    Mutation(
        "finding-2",
        "finding 2: a failed claim keeps its lock",
        "coordinator/hashq_coordinator/machine/core.py",
        "return [GiveBack()]",
        "return []",
    ),
    Mutation(
        "finding-3",
        "finding 3: a new leader lists at once for an incarnation it never saw",
        BOOK,
        'self._sightings[incarnation] = Sighting("", now)',
        'self._sightings[incarnation] = Sighting("", -math.inf)',
    ),
    Mutation(
        "finding-4",
        "finding 4: a closed lease subscribed again or released while its handler runs",
        LEASES,
        "if lease.phase is not Phase.CLOSED or lease.running:",
        "if lease.phase is not Phase.CLOSED:",
    ),
    Mutation(
        "finding-5",
        "finding 5: a channel the broker closed subscribed again at once",
        LEASES,
        "event.reason)\n"
        "            lease.phase = Phase.CLOSING\n"
        "            actions.append(CutOff(lease.number))\n",
        "event.reason)\n"
        "            actions.append(CutOff(lease.number))\n"
        "            del self.leases[lease.number]\n",
    ),
    Mutation(
        "finding-6",
        "finding 6: a fence gives up after a failed management call (the simulated edge)",
        "tools/sim/coordinator.py",
        "            self.later(RETRY_SECONDS, lambda: self._fence(incarnation, generation))\n",
        "",
    ),
    Mutation(
        "finding-7",
        "finding 7: a failed registration ends the worker",
        WORKER,
        "RegisterFailed):\n            self._busy, self._retry_at = False, now + RETRY_SECONDS\n",
        "RegisterFailed):\n            self._busy, self._stop_by = False, now\n",
    ),
    Mutation(
        "finding-8",
        "finding 8: a session verdict asked before a pause taken after it",
        WORKER,
        "if event.asked != self._doubts or self.session is not Session.SUSPENDED:",
        "if self.session is not Session.SUSPENDED:",
    ),
    Mutation(
        "no-fence",
        "no fence at all (grant from `fencing` at once)",
        "coordinator/hashq_coordinator/machine/handover.py",
        "        following = _next(bucket, record, target, view, decision)\n",
        "        following = _next(bucket, record, target, view, decision)\n"
        "        if following.state is BucketState.FENCING:\n"
        "            following = _grant(record, target, view)\n",
    ),
    Mutation(
        "release-at-drain-start",
        "release as the drain starts (acknowledgements after the release)",
        LEASES,
        "            lease.phase = Phase.DRAINING\n"
        "            actions.append(Drain(lease.number, self.drain_timeout))\n",
        "            lease.phase = Phase.RELEASING\n"
        "            actions.append(Drain(lease.number, self.drain_timeout))\n"
        "            actions.append(\n"
        "                WriteRelease(lease.number, lease.bucket, lease.epoch, lease.incarnation)\n"
        "            )\n",
    ),
    Mutation(
        "same-epoch",
        "a grant at the same epoch",
        "coordinator/hashq_coordinator/machine/handover.py",
        "registration.incarnation, record.epoch + 1\n",
        "registration.incarnation, record.epoch\n",
    ),
    Mutation(
        "no-withdrawal",
        "no withdrawal from RabbitMQ outages",
        WORKER,
        "return lost is not None and now - lost >= self.withdraw_after and not self._busy",
        "return False",
    ),
    Mutation(
        "release-after-unconfirmed-close",
        "release after an unconfirmed close",
        LEASES,
        "        if not lease.unconfirmed:\n            return True\n",
        "        return True\n",
    ),
    Mutation(
        "lost-taken-as-up",
        "a connection reported lost taken as up",
        WORKER,
        "self.link_up = connection > self._dead_connection",
        "self.link_up = True",
    ),
    Mutation(
        "lock-released-once",
        "the lock released once on resigning",
        "tools/sim/coordinator.py",
        "            self._fences.clear()\n",
        "            self._fences.clear()\n"  # one try, and the node forgotten: GiveBack finds none
        '            node, self._lock_node = self._lock_node, ""\n'
        "            if node:\n"
        "                self._call(lambda zk, _: zk.delete(node), lambda _: None)\n",
    ),
    Mutation(
        "pause-ignored",
        "a detected pause ignored",
        WORKER,
        "            self._suspect(actions)\n",
        "",
    ),
    Mutation(
        "no-blind-spot",
        "no blind spot: sightings trusted after an election or an outage",
        BOOK,
        "        if now - self._seen_until >= MIN_SESSION_SECONDS:\n"
        "            self._unseen(self._live - live, now)\n",
        "",
    ),
    Mutation(
        "blind-spot-election-only",
        "a blind spot only at an election (not an outage kept through)",
        BOOK,
        "if now - self._seen_until >= MIN_SESSION_SECONDS:",
        "if self._seen_until == -math.inf:",
    ),
    Mutation(
        "gone-owner-unreleased",
        "a bucket whose owner's registration vanished granted at once, released or not",
        "coordinator/hashq_coordinator/machine/handover.py",
        "            if released:\n                return _grant(record, target, view)\n"
        "            return _moving(record, BucketState.FENCING, target, view.now)\n",
        "            return _grant(record, target, view)\n",
    ),
    Mutation(
        "revoke-within-drain",
        "a revoke waits only the owner's drain timeout and the grace, not its session",
        "coordinator/hashq_coordinator/machine/handover.py",
        "return max(registration.drain_timeout + self.fence_grace, registration.session_timeout)",
        "return registration.drain_timeout + self.fence_grace",
    ),
    Mutation(
        "release-without-return-grace",
        "a release after a lost connection does not wait for the queues to take back",
        LEASES,
        "lease.retry_at = self.link_up_since + RETURN_GRACE_SECONDS",
        "lease.retry_at = self.link_up_since",
    ),
    Mutation(
        "grant-without-return-grace",
        "a grant after a fence does not wait for the queues to take back",
        "coordinator/hashq_coordinator/machine/handover.py",
        "done <= self.now - RETURN_GRACE_SECONDS for done",
        "done <= self.now for done",
        also=((_CONTACT_LAPSES, _CONTACT_LAPSES.removesuffix(" + contact")),),
    ),
    Mutation(
        "grant-on-return-without-contact",
        "a grant once the queue took everything back does not wait out the owner's broker contact",
        "coordinator/hashq_coordinator/machine/handover.py",
        _CONTACT_LAPSES,
        _CONTACT_LAPSES.removesuffix(" + contact"),
    ),
    Mutation(
        "early-grant-for-undeclared-contact",
        "an owner whose registration declared no broker contact bound (an older worker) taken to "
        "have this version's bound",
        "coordinator/hashq_coordinator/machine/handover.py",
        "contact = self.contact_bounds.get(owner, math.inf)",
        "contact = self.contact_bounds.get(owner, 0.5)",
    ),
    Mutation(
        "contact-from-any-close",
        "the owner's broker contact counted from the broker's word that any connection of it "
        "closed, not only the one its fence covered",
        "coordinator/hashq_coordinator/machine/fencebook.py",
        "if connection in self._closed.get(incarnation, {})",
        "if self._closed.get(incarnation)",
        also=(
            (
                "incarnation: self._closed[incarnation][connection]",
                "incarnation: min(self._closed[incarnation].values())",
            ),
        ),
    ),
    Mutation(
        "return-proof-from-no-answer",
        "a queue's (0 ready, 0 consumers), which is also its answer when it cannot answer, taken "
        "as proof that it took everything back",
        "hashq/records.py",
        "return consumers == 0 and ready > 0",
        "return consumers == 0",
    ),
    Mutation(
        "reconsume-unproven",
        "a bucket whose connection died under it consumed again at once on the next connection",
        "hashq/worker/machine/proof.py",
        "            self.unproven[lease.bucket] = (lease.epoch, lease.connection)\n",
        "            pass\n",
    ),
    Mutation(
        "reconsume-quiet-at-once",
        "a bucket whose connection died under it consumed again on a quiet queue's word at once",
        "hashq/worker/machine/proof.py",
        "elif quiet and now >= self.link_up_since + RETURN_GRACE_SECONDS:",
        "elif quiet:",
    ),
    Mutation(
        "start-without-contact",
        "a worker starts what it was delivered however long ago the broker last answered it",
        "tools/sim/leases.py",
        "self._heard = heard  #",
        "self._heard = lambda _: True  #",
    ),
    Mutation(
        "thread-pool-queues",
        "a plain handler's job given to a pool with no free thread (it starts when one frees)",
        "tools/sim/leases.py",
        "if (job.thread and not self._thread_free()) or not self._heard(job.lease.connection):\n"
        "                held.append(job)",
        "if not self._heard(job.lease.connection):\n                held.append(job)",
        # A thread that checks before it begins would refuse them: take that check out too.
        ((THREAD_CHECK, "if False:"),),
    ),
    Mutation(
        "thread-begins-unchecked",
        "a handler thread begins its job without checking for a pause or a closed lease",
        "tools/sim/leases.py",
        THREAD_CHECK,
        "if False:",
    ),
    Mutation(
        "withdraw-no-timer",
        "a withdrawn worker sets no timer",
        WORKER,
        "        self._retry_at = now + RETRY_SECONDS"
        "  # the timer that begins the next incarnation\n",
        "",
    ),
    Mutation(
        "move-before-record",
        "a parked key's messages move before its record is written",
        "hashq/worker/machine/parked_keys.py",
        "        self._out.append(WriteRecord(job.key, RecordOp.CREATE, record, why=why))\n",
        "        self._out.append(WriteRecord(job.key, RecordOp.CREATE, record, why=why))\n"
        "        self._keys[job.key].creating = False\n"
        "        self._apply_state(self._keys[job.key])\n",
    ),
    Mutation(
        "park-records-unread",
        "a new lease starts its bucket's messages without reading its parked keys",
        "hashq/worker/machine/lease.py",
        "self.parked.loaded = not parks",
        "self.parked.loaded = True",
    ),
    Mutation(
        "retry-counted-as-running",
        "a failed message waiting for its retry still counts as running in its lease",
        "tools/sim/leases.py",
        "        job.attempt += 1\n        lease.core.dropped(job)\n",
        "        job.attempt += 1\n",
    ),
    Mutation(
        "unpark-unproven",
        "a released key flows again without its parking queue proving it holds nothing",
        "hashq/worker/machine/parked_keys.py",
        "empty = ready == 0 and consumers == 1 and parked.held == 0 and parked.confirmed",
        "empty = parked.held == 0",
    ),
    Mutation(
        "unpark-while-moving",
        "a released key is unparked while one of its messages still moves",
        "hashq/worker/machine/key_phases.py",
        "        if parked.phase is ParkPhase.EMPTYING and parked.moving is not None:\n"
        "            return\n",
        "",
    ),
    Mutation(
        "parked-record-unclaimed",
        "a new owner acts on a parked key's record without claiming it at its epoch",
        "hashq/worker/machine/key_phases.py",
        "        elif record.epoch < self.epoch:\n",
        "        elif False:\n",
    ),
    Mutation(
        "parked-reconsumed-beside-a-cut-handler",
        "a parked key's queue consumed again while the handler its lost channel cut still runs",
        "hashq/worker/machine/parked_keys.py",
        "ParkPhase.EMPTYING) and parked.cut is None:\n            self._consume(parked)\n",
        "ParkPhase.EMPTYING):\n            self._consume(parked)\n",
    ),
    Mutation(
        "resize-without-barrier",
        "a resize grants its new buckets as soon as the routing switched (no markers)",
        "hashq/resizing.py",
        "return Decision(Step.MARK, buckets=waiting) if waiting else Decision(Step.COMMIT)",
        "return Decision(Step.COMMIT)",
    ),
    Mutation(
        "marker-passes-early",
        "a resize's marker passes before what was delivered ahead of it finished",
        "hashq/worker/machine/lease.py",
        "if not (marker.passing or marker.ahead or self._parked_moving(marker.job.marker)):",
        "if not (marker.passing or self._parked_moving(marker.job.marker)):",
    ),
    Mutation(
        "marker-before-acks-in",
        "a marker's passed node written before the broker took in the acks ahead of it",
        "tools/sim/markers.py",
        "self.skip_sync = False",
        "self.skip_sync = True",
    ),
    Mutation(
        "marker-past-moving-parked-key",
        "a marker passes while a key parked in its bucket moves to a new bucket",
        "hashq/worker/machine/lease.py",
        "if not (marker.passing or marker.ahead or self._parked_moving(marker.job.marker)):",
        "if not (marker.passing or marker.ahead):",
    ),
    Mutation(
        "switch-while-routed",
        "the ring grows one binding at a time while the entry exchange routes through it",
        "tools/sim/resizer.py",
        "            broker.unroute()\n",
        "            for k, count in enumerate(range(old + 1, self.wanted), 1):\n"
        "                self.later(hop() * k, lambda c=count: broker.route(c))\n",
    ),
    Mutation(
        "new-bucket-epoch-from-1",
        "a resize's new bucket is first granted at epoch 1, below its moved keys' old epochs",
        "coordinator/hashq_coordinator/machine/handover.py",
        "record = view.records.get(bucket, unseen)",
        "record = view.records.get(bucket, BucketRecord())",
    ),
    Mutation(
        "stale-marker-counted",
        "the marker of an earlier resize counts for a later one",
        "hashq/resizing.py",
        "if parsed is not None and parsed[0] == new:",
        "if parsed is not None:",
    ),
    Mutation(
        "expel-unchecked",
        "a crashed worker's registration deleted whatever its version",
        "tools/sim/coordinator.py",
        "zk.delete(PATHS.worker(worker), version)",
        "zk.delete(PATHS.worker(worker))",
    ),
    Mutation(
        "registrations-unwatched",
        "the leader keeps a registration it read after its node changed (its watch does nothing)",
        "tools/sim/coordinator.py",
        "lambda: self._registrations.changed(name)",
        "lambda: None",
    ),
    Mutation(
        "expel-without-liveness",
        "a worker whose connection closed expelled without asking the broker",
        "coordinator/hashq_coordinator/machine/core.py",
        "(worker, incarnation) in event.gone",
        "True",
    ),
)


def copy_tree(into: Path) -> None:
    for part in COPIED:
        if (ROOT / part).is_file():
            shutil.copy(ROOT / part, into / part)
            continue
        shutil.copytree(ROOT / part, into / part, ignore=shutil.ignore_patterns("__pycache__"))


def apply(mutation: Mutation, tree: Path) -> None:
    """Make the mutation in ``tree``; ValueError unless its old text occurs exactly once."""
    path = tree / mutation.path
    text = path.read_text()
    for old, new in ((mutation.old, mutation.new), *mutation.also):
        found = text.count(old)
        if found != 1:
            raise ValueError(f"its old text occurs {found} times in {mutation.path}")
        text = text.replace(old, new)
    path.write_text(text)


def simulate(tree: Path, budget: Budget) -> tuple[list[int], str]:
    """``python -m tools.sim.run`` in ``tree``, importing only from there: the failed seeds, and
    what it printed."""
    out = tree / "sim.json"
    command = [sys.executable, "-m", "tools.sim.run", "--seeds", str(budget.seeds)]
    command += ["--first", str(budget.first), "--jobs", str(budget.jobs)]
    command += ["--steps", str(budget.steps), "--no-shrink", "--json", str(out)]
    command += [] if budget.parking else ["--no-parking"]
    path = f"{tree}{os.pathsep}{tree / 'coordinator'}"
    env = {**os.environ, "PYTHONPATH": path}  # never the original tree
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if not out.exists():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]  # one line, for the table
        raise RuntimeError(f"tools.sim.run exited {done.returncode}: {last}")
    failed: list[int] = json.loads(out.read_text())["failed"]
    return failed, done.stdout


def kinds(stdout: str) -> Counter[str]:
    """How many seeds reported each kind of violation."""
    found: Counter[str] = Counter()
    for match in VIOLATION.finditer(stdout):
        found[NAMES.sub("*", match.group(2).split(":", 1)[0])] += 1
    return found


def run(mutation: Mutation, budget: Budget) -> Result:
    with tempfile.TemporaryDirectory(prefix=f"hashq-{mutation.name}-") as folder:
        tree = Path(folder)
        copy_tree(tree)
        try:
            apply(mutation, tree)
            failed, stdout = simulate(tree, budget)
        except (ValueError, RuntimeError) as exc:
            return Result(mutation, error=str(exc))
    return Result(mutation, tuple(sorted(failed)), kinds(stdout))


def reported(result: Result) -> str:
    if result.error:
        return f"error: {result.error}"
    return "; ".join(kind for kind, _ in result.kinds.most_common()) or "-"


def line(result: Result, budget: Budget) -> str:
    if result.error:
        return f"{result.mutation.name}: {reported(result)}"
    first = result.failed[0] if result.failed else "-"
    counted = ", ".join(f"{kind} x{n}" for kind, n in result.kinds.most_common()) or "-"
    failed = f"{len(result.failed)} of {budget.seeds} seeds failed"
    return f"{result.mutation.name}: {failed}, first {first}: {counted}"


def markdown(results: list[Result]) -> str:
    rows = ["| taken out | seeds failing | first | reported as |", "|---|---|---|---|"]
    for result in results:
        failing = "-" if result.error else str(len(result.failed))
        first = str(result.failed[0]) if result.failed else "-"
        rows.append(f"| {result.mutation.what} | {failing} | {first} | {reported(result)} |")
    return "\n".join(rows) + "\n"


def chosen(names: list[str], parser: argparse.ArgumentParser) -> list[Mutation]:
    by_name = {mutation.name: mutation for mutation in MUTATIONS}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        parser.error(f"no mutation named {', '.join(unknown)} (see --list)")
    return [by_name[name] for name in names] if names else list(MUTATIONS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.sim.mutations", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("names", nargs="*", metavar="NAME", help="these mutations only")
    parser.add_argument("--seeds", type=int, default=240, help="how many seeds, from --first")
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="processes running seeds at once")
    parser.add_argument("--steps", type=int, default=20000, help="steps of faults per seed")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--list", action="store_true", help="print names and descriptions")
    args = parser.parse_args(argv)
    mutations = chosen(args.names, parser)
    if args.list:
        for mutation in mutations:
            print(f"{mutation.name:32} {mutation.what}")
        return 0
    budget = Budget(args.seeds, args.first, args.jobs, args.steps)
    results = []
    for mutation in mutations:
        results.append(run(mutation, budget))
        print(line(results[-1], budget), flush=True)
    if args.markdown:
        args.markdown.write_text(markdown(results))
    return 1 if any(result.error for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
