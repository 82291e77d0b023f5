"""The short chaos run: hashq under a fixed-seed fault schedule drawn from the chaos faults
(worker kills, stops, leader kills, broker and ZooKeeper restarts), judged by the independent
checker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
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
    process = subprocess.Popen(
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
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so that a timeout can end the harness and all it started
    )
    try:
        stdout, _ = process.communicate(timeout=480)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, _ = process.communicate()
        pytest.fail("the chaos run did not finish in 8 minutes:\n" + stdout[-3000:])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything it left behind
    report = json.loads((tmp_path / "report.json").read_text())
    verdict = report["hashq"]
    summary = json.dumps(verdict) + "\n" + stdout[-2000:]
    assert verdict["lost"] == 0, summary
    assert verdict["reordered"] == 0, summary
    assert verdict["overlapping_same_epoch"] == 0, summary
    assert verdict["confirmed"] > 5_000, summary
    assert sum(1 for fault in report["faults"] if fault["counts"]) >= 4, summary
    assert process.returncode == 0, summary
