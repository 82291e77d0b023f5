"""`make run`'s demo, shortened: it must finish with nothing lost and nothing out of order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hashq.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_runs_clean(settings: Settings) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("HASHQ_")}
    env.update(
        HASHQ_AMQP_URL=settings.amqp_url,
        HASHQ_ZK_HOSTS=settings.zk_hosts,
        HASHQ_MANAGEMENT_URL=settings.management_url,
        HASHQ_APP="demo",
        HASHQ_BUCKETS="8",
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.demo",
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
