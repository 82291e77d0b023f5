"""`make run`'s demo, shortened: it must finish with nothing lost and nothing out of order."""

from __future__ import annotations

import subprocess
import sys

from hashq.settings import Settings
from tools import ROOT
from tools.launcher import child_environment


def test_the_demo_runs_clean(settings: Settings) -> None:
    env = child_environment(settings, HASHQ_APP="demo", HASHQ_BUCKETS="8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.demo.run",
            "--seconds",
            "8",
            "--rate",
            "200",
            "--users",
            "200",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "lost                      0" in done.stdout
    assert "order violations          0" in done.stdout
    assert "sent SIGKILL to worker-2" in done.stdout
    assert "hashq resize --buckets 16" in done.stdout
    statuses = [line for line in done.stdout.splitlines() if "| workers" in line]
    assert "| 16 buckets |" in statuses[-1], done.stdout[-3000:]  # the resize was committed
