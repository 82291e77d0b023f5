"""The package as a new user gets it: an sdist and a wheel built from the checkout, the wheel
installed in a new virtual environment, then the README's five-minute path run as it is
written, against the real servers (only the wheel's path put in for ``./hashq``)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from hashq.settings import Settings
from tools import ROOT
from tools.launcher import child_environment
from tools.polling import wait_until

PACKAGED = ["pyproject.toml", "README.md", "LICENSE", "hashq", "coordinator"]


def five_minute_path() -> str:
    """The first shell block under the README's "Five minutes" heading."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Five minutes") :]
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match, "the README has no five-minute path"
    return match.group(1)


def build(into: Path) -> tuple[Path, Path]:
    """The sdist and the wheel, built from a copy of what the package is made of (a build
    writes into its source tree)."""
    source = into / "source"
    for name in PACKAGED:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, source / name)
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(into / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = (into / "dist").glob("hashq-*.tar.gz")
    (wheel,) = (into / "dist").glob("hashq-*.whl")
    return sdist, wheel


def test_the_wheel_installs_and_the_readme_s_five_minutes_work(
    settings: Settings, tmp_path: Path
) -> None:
    sdist, wheel = build(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert {name.split("/")[0] for name in names} == {
        "hashq",
        "hashq_coordinator",
        wheel.name.split("-py3")[0] + ".dist-info",
    }  # no tools, no tests
    assert {"hashq/py.typed", "hashq_coordinator/py.typed"} <= set(names)
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    with tarfile.open(sdist) as archive:
        assert f"{sdist.name.removesuffix('.tar.gz')}/LICENSE" in archive.getnames()

    script = five_minute_path()
    assert "pip install ./hashq" in script
    script = script.replace("pip install ./hashq", f"pip install -q {wheel}")
    env = {
        name: value
        for name, value in child_environment(settings).items()
        if not name.startswith(("PYTHON", "VIRTUAL_ENV"))  # the installed package, not ours
    }
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        shell = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the worker and coordinator it leaves running, too
        )
        try:
            assert shell.wait(timeout=300) == 0, out.read_text()[-3000:]
            wait_until(lambda: _in_order(out.read_text()), 60, what="the worker's two lines")
        finally:
            _end_session(shell.pid)
    assert "Traceback" not in out.read_text()


def _in_order(text: str) -> bool:
    lines = text.splitlines()  # the processes' log lines come between them
    return {"user-1 hello", "user-1 again"} <= set(lines) and lines.index(
        "user-1 hello"
    ) < lines.index("user-1 again")


def _end_session(group: int) -> None:
    """SIGTERM to what the script left running (the worker drains), SIGKILL after 30 s."""
    os.killpg(group, signal.SIGTERM)
    try:
        wait_until(lambda: not _alive(group), 30, what="the script's processes to exit")
    except TimeoutError:
        os.killpg(group, signal.SIGKILL)


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
