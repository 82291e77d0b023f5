"""The chaos run's table: each design's verdict, its worst recovery per kind of fault, what
the holds and clock steps did, its longest stalls, examples of what went wrong, and the poison
keys (``tools.chaos.poison``)."""

from __future__ import annotations

from typing import Any

ROWS = [
    ("confirmed", "confirmed"),
    ("executions", "executions"),
    ("keys", "keys"),
    ("lost", "lost"),
    ("unfinished (still queued)", "unfinished"),
    ("reordered", "reordered"),
    ("overlapping, same epoch/no token", "overlapping_same_epoch"),
    ("overlapping, fenced zombie", "overlapping_zombie"),
    ("overlapping, stale start", "overlapping_stale"),
    ("stale starts (older epoch)", "stale_starts"),
    ("duplicates", "duplicates"),
    ("dead-lettered", "dead_lettered"),
]


def print_table(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    width = max(22, *(len(results[name]["title"]) + 2 for name in names))
    print("\n  " + " " * 34 + "".join(f"{results[n]['title']:>{width}}" for n in names))
    print(
        "  "
        + f"{'faults injected':<34}"
        + "".join(f"{len(results[n]['faults']):>{width},}" for n in names)
    )
    for label, field in ROWS:
        cells = "".join(f"{results[n]['verdict'][field]:>{width},}" for n in names)
        print(f"  {label:<34}{cells}")
    kinds = sorted({kind for n in names for kind in results[n]["recovery"]["by_kind"]})
    print("\n  worst time to recover, by fault (s; + buckets never recovered; after the heal)")
    for kind in kinds:
        cells = "".join(
            f"{_recovered(results[n]['recovery']['by_kind'].get(kind)):>{width}}" for n in names
        )
        print(f"  {kind:<34}{cells}")
    for name in names:
        held = results[name]["workload"]
        print(
            f"  {name}: {held['past_drain_timeout']:,} handlers ran past the drain timeout"
            f" ({held['past_drain_timeout_in_threads']:,} in threads);"
            f" {held['consumer_timeouts']:,} channels closed by consumer_timeout;"
            f" {held['under_stepped_clock']:,} executions under a stepped wall clock;"
            f" {held.get('late_first_lines', 0):,} handlers began over 0.5 s after their start"
        )
    for name in names:
        if poison := results[name].get("poison"):
            print(
                f"  {name}: poison keys {', '.join(poison['keys'])}:"
                f" parked {poison['parked_failed']} times,"
                f" released {sum(poison['released'].values())} times,"
                f" flowed again {poison['flowed_again']} times;"
                f" {poison['hot_steps_aside']} hot keys stepped aside"
            )
    for name in names:
        if resizes := results[name].get("resizes"):
            done = [
                f"to {r['buckets']} in {r['seconds']:.1f}s ({r['runs']} runs, {r['killed']} killed)"
                if r["seconds"] is not None
                else f"to {r['buckets']} NOT DONE ({r['runs']} runs)"
                for r in resizes
            ]
            print(f"  {name}: resized {'; '.join(done)}")
    for name in names:
        for stall in results[name]["recovery"]["stalls"][:3]:
            causes = ", ".join(stall["causes"]) or "no fault in force"
            stretch = f"bucket {stall['bucket']} started nothing for {stall['seconds']}s"
            print(f"  {name}: {stretch} ({causes})")
    for name in names:
        for kind, examples in results[name]["verdict"]["examples"].items():
            print(f"  {name}, e.g. {kind}: {'; '.join(examples[:3])}")


def _recovered(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "-"
    worst = "never" if summary["worst_s"] is None else f"{summary['worst_s']:.1f}"
    stuck = summary["unrecovered_buckets"]
    healed = summary.get("worst_after_heal_s")
    return worst + (f" +{stuck}" if stuck else "") + ("" if healed is None else f" ({healed:.1f})")
