"""``make sim``: run seeds of the deterministic simulation; a failing seed is shrunk to the
fewest faults that still fail, and its trace printed.

    python -m tools.sim.run --seeds 50 --steps 20000          # seeds 1..50
    python -m tools.sim.run --seed 17 --trace                 # replay one seed, with its trace
    python -m tools.sim.run --seed 17 --faults 0,3,5 --trace  # replay it with some of its faults
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator

from tools.sim.cluster import Cluster, Outcome, Scenario
from tools.sim.faults import FAULT_KINDS, Fault
from tools.sim.world import World

log = logging.getLogger("sim")


def simulate(
    seed: int, steps: int, faults: list[Fault] | None = None, parking: bool = True
) -> Outcome:
    """``parking``: False draws the seed as before parked keys and resizes (no poisoned key, no
    resize), as the seeds kept for bugs found before them were drawn."""
    scenario = Scenario.draw(seed, parking=parking, resize=parking)
    return Cluster(scenario, faults).run(steps)


def _quiet_simulate(job: tuple[int, int, None, bool]) -> Outcome:
    logging.disable(logging.CRITICAL)
    return simulate(*job)


def outcomes(
    seeds: Iterable[int], steps: int, jobs: int, parking: bool = True
) -> Iterator[Outcome]:
    """Each seed's outcome, in seed order; ``jobs`` processes at once."""
    work = [(seed, steps, None, parking) for seed in seeds]
    if jobs <= 1:
        yield from (simulate(*job) for job in work)
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap(_quiet_simulate, work)


def violation_kind(text: str) -> str:
    """What a shrunk run must still show: "reordered", "stale start", "not done ...", ..."""
    return text.split(":", 1)[0]


def shrink(seed: int, steps: int, outcome: Outcome) -> tuple[list[Fault], Outcome]:
    """The fewest of the applied faults that still make the seed fail (delta debugging over
    the fault list: drop halves, then quarters, ... while it still fails)."""
    faults = list(outcome.applied)
    worst = outcome
    kind = violation_kind(outcome.violation)
    chunk = max(1, len(faults) // 2)
    while chunk >= 1 and faults:
        start, changed = 0, False
        while start < len(faults):
            trial = faults[:start] + faults[start + chunk :]
            result = simulate(seed, steps, trial)
            if violation_kind(result.violation) == kind:
                faults, worst, changed = trial, result, True
            else:
                start += chunk
        if not changed:
            chunk //= 2
    return faults, worst


def report(outcome: Outcome, faults: list[Fault], trace_lines: int) -> str:
    lines = [f"seed {outcome.seed}: VIOLATION {outcome.violation}"]
    lines.append(
        f"  replay: python -m tools.sim.run --seed {outcome.seed} --faults "
        + ",".join(f"{f.at}:{f.kind}:{f.target}:{f.duration}" for f in faults)
        + " --trace"
    )
    lines.append(f"  {len(faults)} fault(s):")
    lines.extend(f"    {fault}" for fault in faults)
    lines.append(f"  last {trace_lines} events:")
    lines.extend(f"    {line}" for line in outcome.trace[-trace_lines:])
    return "\n".join(lines)


def parse_faults(text: str) -> list[Fault]:
    faults = []
    for item in text.split(","):
        at, kind, target, duration = item.split(":")
        faults.append(Fault(float(at), kind, int(target), float(duration)))
    return faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.sim.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds, from --first")
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--seed", type=int, help="one seed only")
    parser.add_argument("--steps", type=int, default=20000, help="steps of faults per seed")
    parser.add_argument("--faults", help="replay with these faults (at:kind:target:duration,...)")
    parser.add_argument("--trace", action="store_true", help="log every decision, on virtual time")
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument(
        "--no-parking", action="store_true", help="seeds as drawn before parked keys (no poison)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="processes running seeds at once")
    parser.add_argument("--json", help="write the totals here")
    args = parser.parse_args(argv)
    if args.trace:
        logging.basicConfig(level=logging.INFO, format="%(vt)9.3f %(message)s")
        made = logging.getLogRecordFactory()

        def on_virtual_time(*args: object, **kwargs: object) -> logging.LogRecord:
            record = made(*args, **kwargs)
            record.vt = World.current.now if World.current is not None else 0.0
            return record

        logging.setLogRecordFactory(on_virtual_time)
    else:
        logging.disable(logging.CRITICAL)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    given = parse_faults(args.faults) if args.faults else None
    totals: Counter[str] = Counter()
    failed = []
    began = time.monotonic()
    runs = (
        outcomes(seeds, args.steps, args.jobs, not args.no_parking)
        if given is None
        else [simulate(args.seed, args.steps, given, not args.no_parking)]
    )
    for outcome in runs:
        seed = outcome.seed
        totals["seeds"] += 1
        totals["steps"] += outcome.steps
        totals["confirmed"] += outcome.confirmed
        totals["executions"] += outcome.executions
        totals["expelled"] += outcome.expelled
        totals.update({f"fault:{k}": v for k, v in outcome.fault_counts.items()})
        if outcome.violation:
            faults = outcome.applied
            if not args.no_shrink and given is None:
                faults, outcome = shrink(seed, args.steps, outcome)
            failed.append(seed)
            print(report(outcome, faults, 40), flush=True)
    totals["violations"] = len(failed)
    seconds = time.monotonic() - began
    missing = [k for k in FAULT_KINDS if not totals[f"fault:{k}"]]
    print(
        f"sim: {totals['seeds']} seeds, {totals['steps']:,} steps, {totals['confirmed']:,} "
        f"confirmed, {totals['executions']:,} executions, {totals['expelled']:,} crashes "
        "expelled, "
        f"{sum(v for k, v in totals.items() if k.startswith('fault:'))} faults, "
        f"{len(failed)} violations ({seconds:.0f}s)"
        + (f"; fault kinds never drawn: {missing}" if missing else "")
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"totals": dict(totals), "failed": failed, "seconds": seconds}, out, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
