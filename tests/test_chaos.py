"""The short chaos run: hashq under a fixed-seed fault schedule (worker kills, stops, a leader
kill, broker and ZooKeeper restarts), judged by the independent checker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hashq.settings import Settings
from tests.helpers import child_environment
from tests.services import Endpoints

ROOT = Path(__file__).resolve().parent.parent


def test_short_chaos_run_loses_and_reorders_nothing(
    endpoints: Endpoints, settings: Settings, tmp_path: Path
) -> None:
    if endpoints.restart is None:
        pytest.skip(f"servers from {endpoints.source} cannot be restarted by the tests")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "chaos.run",
            "--duration",
            "50",
            "--seed",
            "11",
            "--gap",
            "6",
            "--rate",
            "400",
            "--keys",
            "500",
            "--app",
            "chaos",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=child_environment(settings),
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads((tmp_path / "report.json").read_text())
    verdict = report["hashq"]
    summary = json.dumps(verdict) + "\n" + done.stdout[-2000:]
    assert verdict["lost"] == 0, summary
    assert verdict["reordered"] == 0, summary
    assert verdict["overlapping_same_epoch"] == 0, summary
    assert verdict["confirmed"] > 5_000, summary
    assert sum(1 for fault in report["faults"] if fault["counts"]) >= 4, summary
    assert done.returncode == 0, summary
