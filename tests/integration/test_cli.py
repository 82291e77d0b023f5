"""The ``hashq`` command as a user runs it: exit statuses, one-line errors, real effects."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from urllib.parse import quote

import pytest

from hashq._io.management import Management
from hashq.settings import Settings
from hashq.topology import Topology
from tests.support.helpers import hashq, into_a_closed_pipe, open_zk, queue_depths
from tools.launcher import child_environment


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("hashq:")]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def _nothing_created(settings: Settings, management: Management) -> None:
    vhost = quote(settings.vhost, safe="")
    names = [exchange["name"] for exchange in management.request("GET", f"/api/exchanges/{vhost}")]
    assert not [name for name in names if name.startswith("hashq.")]
    assert management.request("GET", f"/api/queues/{vhost}") == []
    client = open_zk(settings.zk_hosts)
    try:
        assert client.exists("/hashq") is None
    finally:
        client.stop()
        client.close()


@pytest.mark.parametrize(
    ("flags", "setting"),
    [
        (["--buckets", "0"], "HASHQ_BUCKETS"),
        (["--queue-type", "stream"], "HASHQ_QUEUE_TYPE"),
        (["--app", "No Spaces"], "HASHQ_APP"),
        (["--amqp-url", "amqp://user:s3cret@host:bad/"], "HASHQ_AMQP_URL"),
    ],
)
def test_bad_setting_exits_2_with_one_line_and_creates_nothing(
    settings: Settings, management: Management, flags: list[str], setting: str
) -> None:
    done = hashq(settings, "init", *flags)
    assert done.returncode == 2
    line = one_line_error(done)
    assert setting in line
    assert "s3cret" not in done.stderr + done.stdout
    _nothing_created(settings, management)


def test_unreachable_broker_is_one_line_without_the_password(settings: Settings) -> None:
    done = hashq(
        settings, "init", "--amqp-url", "amqp://user:s3cret@127.0.0.1:1/", "--connect-timeout", "3"
    )
    assert done.returncode == 1
    line = one_line_error(done)
    assert "cannot be reached" in line
    assert "s3cret" not in done.stderr


def test_init_publish_status(settings: Settings) -> None:
    assert hashq(settings, "init").returncode == 0
    lines = "\n".join(json.dumps({"key": f"user-{n % 7}", "body": {"n": n}}) for n in range(300))
    done = hashq(settings, "publish", "--quiet", stdin=lines + "\n")
    assert done.returncode == 0, done.stderr
    assert "published 300 messages" in done.stderr

    status = hashq(settings, "status", "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["total_messages"] == 300
    assert len(report["buckets"]) == settings.buckets
    assert sum(bucket["messages"] for bucket in report["buckets"]) == 300
    assert sum(1 for bucket in report["buckets"] if bucket["messages"]) <= 7

    table = hashq(settings, "status")
    assert "300 messages queued" in table.stdout
    assert "hashq.t.b0007" in table.stdout


async def test_publish_stops_at_a_bad_line_and_keeps_what_came_before(settings: Settings) -> None:
    assert hashq(settings, "init").returncode == 0
    good = [json.dumps({"key": f"k{n}", "body": "x"}) for n in range(5)]
    done = hashq(settings, "publish", "--quiet", stdin="\n".join([*good, '{"key": ""}', *good]))
    assert done.returncode == 2
    line = one_line_error(done)
    assert "line 6" in line
    assert "5 messages confirmed" in line
    depths = await queue_depths(settings)
    assert sum(depths.values()) == 5


def test_init_with_other_settings_exits_2(settings: Settings) -> None:
    assert hashq(settings, "init").returncode == 0
    done = hashq(settings, "init", "--buckets", "16")
    assert done.returncode == 2
    assert "already exists with 8 buckets, not 16" in one_line_error(done)
    assert "hashq resize --buckets 16" in one_line_error(done)


def test_status_before_init_says_run_init(settings: Settings) -> None:
    done = hashq(settings, "status")
    assert done.returncode == 2
    assert "hashq init" in one_line_error(done)


def test_status_whose_reader_went_away_ends_without_a_traceback(settings: Settings) -> None:
    """``hashq status | head``: the reader closes the pipe before the table is written."""
    assert hashq(settings, "init").returncode == 0
    command = [sys.executable, "-m", "hashq.admin.cli", "status"]
    status, errors = into_a_closed_pipe(command, env=child_environment(settings))
    assert status == 141, errors
    assert errors == ""


def test_an_app_is_deleted_only_once_nothing_runs_on_it_and_its_user_says_yes(
    settings: Settings, management: Management
) -> None:
    assert hashq(settings, "init").returncode == 0
    lines = "\n".join(json.dumps({"key": f"k{n}", "body": n}) for n in range(5))
    assert hashq(settings, "publish", "--quiet", stdin=lines).returncode == 0
    zk = open_zk(settings.zk_hosts)
    try:
        zk.create(f"/hashq/{settings.app}/workers/w-running", b"{}", ephemeral=True)
        refused = hashq(settings, "apps", "delete", "--yes")
        assert refused.returncode == 2
        assert "worker w-running running: stop them first" in one_line_error(refused)
    finally:
        zk.stop()
        zk.close()
    asked = hashq(settings, "apps", "delete", stdin="no\n")
    assert asked.returncode == 1
    assert "5 messages" in asked.stderr and "nothing deleted" in asked.stderr
    assert hashq(settings, "status").returncode == 0

    done = hashq(settings, "apps", "delete", "--yes")
    assert done.returncode == 0, done.stderr
    assert management.request("GET", f"/api/queues/{quote(settings.vhost, safe='')}") == []
    gone = hashq(settings, "status")
    assert gone.returncode == 2
    assert "hashq init" in one_line_error(gone)


def test_status_watch_shows_it_again_until_interrupted(settings: Settings) -> None:
    assert hashq(settings, "init").returncode == 0
    command = [sys.executable, "-m", "hashq.admin.cli", "status", "--watch", "0.2"]
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_environment(settings),
    ) as process:
        assert process.stdout is not None
        shown = 0
        while shown < 3:  # three reports, however slowly a loaded machine starts the command
            line = process.stdout.readline()
            assert line, "hashq status --watch ended by itself"
            shown += "0 messages queued" in line
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "Traceback" not in err


def test_where_names_each_key_s_bucket_its_queue_and_holder(settings: Settings) -> None:
    assert hashq(settings, "init").returncode == 0
    topology = Topology.from_settings(settings)
    done = hashq(settings, "where", "user-1", "user-2", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [row["key"] for row in rows] == ["user-1", "user-2"]
    assert [row["bucket"] for row in rows] == [topology.bucket_of(k) for k in ("user-1", "user-2")]
    text = hashq(settings, "where", "user-1").stdout
    bucket = topology.bucket_of("user-1")
    assert text.startswith(f"user-1: bucket {bucket} ({topology.bucket_queue(bucket)}, 0 queued)")
