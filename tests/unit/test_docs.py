"""The docs name modules, objects and files of the tree; each one named must exist, so that a
move or a rename cannot leave the docs pointing at nothing."""

from __future__ import annotations

import importlib
import re

import pytest

from hashq.tracing import SPAN_ATTRIBUTES
from tools import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUR_PACKAGES = ("hashq", "hashq_coordinator", "tools", "tests")
# `hashq.worker.jobs.Outcomes.settle`, `tools.checker`: dotted names in backticks
DOTTED = re.compile(r"`((?:hashq|hashq_coordinator|tools|tests)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")
# tools/sim/run.py, tests/e2e/test_cluster.py, coordinator/hashq_coordinator/machine/core.py
PATH = re.compile(
    r"(?<![\w/.-])((?:hashq|coordinator|tools|tests|docs|deploy|examples|docker)/[\w/.-]*\w)"
)


def _named(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    found = set()
    for doc in DOCS:
        for name in pattern.findall(doc.read_text()):
            found.add((doc.name, name))
    return sorted(found)


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute (of an attribute...) of one."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(target, attribute):
                annotations = getattr(target, "__annotations__", {})
                fields = getattr(target, "model_fields", {})
                if attribute not in annotations and attribute not in fields:
                    return False
                return attribute == parts[-1]
            target = getattr(target, attribute)
        return True
    return False


@pytest.mark.parametrize(("doc", "dotted"), _named(DOTTED))
def test_every_module_and_object_the_docs_name_exists(doc: str, dotted: str) -> None:
    if dotted in SPAN_ATTRIBUTES:
        return  # a span attribute's name, not a module (hashq.tracing)
    assert _resolves(dotted), f"{doc} names `{dotted}`, which does not exist"


@pytest.mark.parametrize(("doc", "path"), _named(PATH))
def test_every_file_the_docs_name_exists(doc: str, path: str) -> None:
    assert (ROOT / path).exists(), f"{doc} names {path}, which does not exist"


def _tree() -> str:
    """The annotated tree of docs/design.md ("The tree")."""
    design = (ROOT / "docs" / "design.md").read_text()
    section = design.split("## The tree", 1)[1]
    return section.split("```", 2)[1]


DESCRIBED = [
    "hashq",
    "hashq/_io",
    "hashq/admin",
    "hashq/worker",
    "hashq/worker/machine",
    "coordinator/hashq_coordinator",
    "coordinator/hashq_coordinator/machine",
    "coordinator/hashq_coordinator/fencing",
    "tools",
]


@pytest.mark.parametrize("folder", DESCRIBED)
def test_the_tree_in_the_design_names_every_module_and_folder(folder: str) -> None:
    tree = _tree()
    missing = [
        entry.name
        for entry in sorted((ROOT / folder).iterdir())
        if entry.name not in ("__init__.py", "__pycache__", "py.typed")
        and (entry.suffix in (".py", ".sh") or entry.is_dir())
        and not re.search(rf"\b{re.escape(entry.stem)}\b", tree)
    ]
    assert missing == [], f"docs/design.md's tree does not name {missing} of {folder}/"
