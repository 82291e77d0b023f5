"""The commands as a user meets them before any server answers: ``--help``, ``--version``,
settings that are misspelt or contradict each other, handlers that cannot be loaded. The
commands' effects on real servers are tests/integration/test_cli.py's."""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hashq._io.command import every_settings_kind, logging_from_args
from hashq.admin import cli as admin_cli
from hashq.errors import ConfigError, SettingsError
from hashq.settings import WorkerSettings, load_settings, unknown_variables
from hashq.worker import cli as worker_cli
from tests.support.helpers import into_a_closed_pipe, user_module
from tools import ROOT


def _run(
    module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def test_help_gives_each_setting_its_variable_default_and_allowed_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        worker_cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "usage: hashq-worker [options] package.module:function" in text
    assert "(HASHQ_CONCURRENCY; default 32)" in text
    assert "(one of dead-letter, block, park; HASHQ_ON_FAILURE; default dead-letter)" in text
    assert "(HASHQ_DRAIN_TIMEOUT; default 30)" in text
    assert "worker:" in text and "services and app:" in text


def test_an_offline_command_lists_no_settings_and_no_variable_stops_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit):
        admin_cli.main(["zk-digest", "--help"])
    assert "--amqp-url" not in capsys.readouterr().out
    monkeypatch.setenv("HASHQ_AMQP_URL", "not a url")
    monkeypatch.setenv("HASHQ_BUCKETS", "many")
    assert admin_cli.main(["zk-digest", "user:secret"]) == 0
    assert capsys.readouterr().out.startswith("user:")


@pytest.mark.parametrize("module", ["hashq.admin.cli", "hashq.worker.cli", "hashq_coordinator.cli"])
def test_every_command_tells_its_version(module: str) -> None:
    done = _run(module, "--version")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"hashq(-worker|-coordinator)? \d+\.\d+\.\d+\S*\n", done.stdout)


def test_a_misspelt_variable_is_named_with_the_setting_it_resembles() -> None:
    environ = {
        "HASHQ_CONCURENCY": "5",  # misspelt
        "HASHQ_SETTLE": "2",  # the coordinator's: a shared environment is no mistake
        "HASHQ_LOG_LEVEL": "debug",
        "HASHQ_TEST_AMQP_URL": "amqp://x/",  # the project's tooling
        "HASHQ_FROBNICATE": "1",
        "PATH": "/bin",
    }
    lines = unknown_variables(environ, every_settings_kind())
    assert lines == [
        "HASHQ_CONCURENCY is set but is no hashq setting, so it is ignored; "
        "did you mean HASHQ_CONCURRENCY?",
        "HASHQ_FROBNICATE is set but is no hashq setting, so it is ignored",
    ]


def test_the_worker_warns_of_a_misspelt_variable_once_and_goes_on() -> None:
    """Through the real command: the warning comes before anything else is checked (here the
    handler, which is missing, so the worker stops without reaching a server)."""
    env = {"PATH": "/usr/bin:/bin", "HASHQ_CONCURENCY": "5"}
    done = _run("hashq.worker.cli", "no_such_module:handle", env=env)
    assert done.returncode == 2
    warnings = [line for line in done.stderr.splitlines() if "HASHQ_CONCURENCY" in line]
    assert len(warnings) == 1
    assert "did you mean HASHQ_CONCURRENCY?" in warnings[0]


def test_the_project_sets_no_variable_that_its_commands_would_warn_of() -> None:
    """Every ``HASHQ_`` name in the tree is a setting, a command's own or the tooling's (this
    file's misspelt examples aside)."""
    names = set()
    for folder in ("hashq", "coordinator", "tools", "tests", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".md", ".sh", ".yml"} and path != Path(__file__):
                names.update(re.findall(r"\bHASHQ_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    names -= {"HASHQ_NAME"}  # the docs' placeholder for any setting
    assert unknown_variables(dict.fromkeys(names, ""), every_settings_kind()) == []


def test_settings_that_contradict_each_other_are_refused() -> None:
    with pytest.raises(SettingsError, match=r"retry_base_delay \(10 s\) is longer than"):
        load_settings(WorkerSettings, retry_base_delay=10, retry_max_delay=1)


def test_a_log_level_may_be_given_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HASHQ_LOG_LEVEL", "debug")
    root = logging.getLogger()
    before = root.level
    try:
        logging_from_args(argparse.Namespace())
        assert logging.getLogger("hashq").getEffectiveLevel() == logging.DEBUG
    finally:
        root.setLevel(before)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("no_such_module:handle", "handler module 'no_such_module' not found"),
        ("needs:handle", "failed to import: it imports 'no_such_dependency', not installed"),
        ("raises:handle", r"failed to import: .*raises\.py:2: ZeroDivisionError"),
        ("broken:handle", r"failed to import: .*broken\.py:1: SyntaxError"),
        ("good:missing", "'good' has no attribute 'missing'"),
        ("good:number", r"is not callable \(an object of type int\)"),
        ("good:two", "second parameter 'b' has no type"),
        ("good:handlers.method", r"cannot be called with one message: its signature is \(\)"),
        ("good", "is not of the form package.module:function"),
    ],
)
def test_a_handler_that_cannot_be_loaded_says_why_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, expected: str
) -> None:
    user_module(tmp_path, monkeypatch, "needs", "import no_such_dependency\n")
    user_module(tmp_path, monkeypatch, "raises", "x = 1\nx = 1 / 0\n")
    user_module(tmp_path, monkeypatch, "broken", "def handle(:\n")
    user_module(
        tmp_path,
        monkeypatch,
        "good",
        "number = 1\ndef two(a, b): ...\nclass Handlers:\n    def method(self): ...\n"
        "handlers = Handlers()\nasync def handle(msg): ...\n",
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=expected) as raised:
        worker_cli.load_handler(spec)
    assert "\n" not in str(raised.value)
    assert worker_cli.load_handler("good:handle") is not None


def test_a_short_output_whose_reader_went_away_ends_without_a_traceback() -> None:
    """One line, written only when the command ends: the interpreter's last flush would meet
    the closed pipe after the command's own error handling (tests/integration/test_cli.py
    has a table that meets it mid-way)."""
    command = [sys.executable, "-m", "hashq.admin.cli", "zk-digest", "user:secret"]
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    status, errors = into_a_closed_pipe(command, cwd=ROOT, env=buffered)
    assert status == 141, errors
    assert errors == ""
