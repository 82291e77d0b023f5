"""The profile's arithmetic (``tools.bench.profile``): py-spy's folded stacks split into CPU per
1,000 messages by layer and by hashq function."""

from __future__ import annotations

from pathlib import Path

from tools.bench.profile import by_layer, folded, hashq_functions, layer

STACKS = """\
main (hashq/worker/cli.py:1);Runners._run (hashq/worker/runners.py:9) 30
main (hashq/worker/cli.py:1);unmarshal (pamqp/frame.py:66) 10
main (x.py:1);BaseEventLoop._run_once (asyncio/base_events.py:1) 40
main (x.py:1);FrameReceiver.get_frame (aiormq/connection.py:227) 20
"""


def test_each_sample_counts_for_its_innermost_frame_s_layer(tmp_path: Path) -> None:
    path = tmp_path / "w.folded"
    path.write_text(STACKS)
    stacks = folded(path)
    split = by_layer(stacks, per_1k=50.0)
    assert split == {
        "asyncio: loop, tasks, futures, transports": 20.0,
        "hashq worker runtime: runners, acks, jobs, leases": 15.0,
        "aiormq: connection reader, channels, futures": 10.0,
        "pamqp: frames decoded and encoded": 5.0,
    }
    assert hashq_functions(stacks, per_1k=50.0) == {"Runners._run (hashq/worker/runners.py)": 15.0}


def test_the_machines_are_told_from_the_runtime_and_the_rest_is_other() -> None:
    assert layer("deliver (hashq/worker/machine/lease.py:3)").startswith("hashq worker machines")
    assert layer("ack (hashq/worker/bucket_lease.py:3)").startswith("hashq worker runtime")
    assert layer("loads (json/decoder.py:1)") == "other"
