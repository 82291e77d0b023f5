"""The leader's registrations between looks: read once, kept until a watch or a lost
connection says otherwise (``hashq_coordinator.registrations``)."""

from __future__ import annotations

from hashq.records import Registration
from hashq_coordinator.registrations import Member, Registrations, listed_in_order


def _member(incarnation: str, version: int = 0) -> Member:
    return Member(Registration(incarnation[0], incarnation, capacity=1), version)


def _look(known: Registrations, names: list[str], nodes: dict[str, Member]) -> list[str]:
    """One look: what it had to read, and the members it saw (checked against ``nodes``)."""
    kept, unread, generation = known.unread(names)
    read = {name: nodes[name] for name in unread if name in nodes}
    known.remember(generation, read)
    assert listed_in_order(names, kept, read) == {n: nodes[n] for n in names if n in nodes}
    return unread


def test_an_unchanged_registration_is_read_once() -> None:
    known, nodes = Registrations(), {"a": _member("a1"), "b": _member("b1")}
    assert _look(known, ["a", "b"], nodes) == ["a", "b"]
    assert _look(known, ["a", "b"], nodes) == []


def test_a_changed_registration_is_read_again_and_a_new_one_at_once() -> None:
    known, nodes = Registrations(), {"a": _member("a1"), "b": _member("b1")}
    _look(known, ["a", "b"], nodes)
    nodes["a"] = _member("a2", version=1)
    known.changed("a")
    nodes["c"] = _member("c1")
    assert _look(known, ["a", "b", "c"], nodes) == ["a", "c"]
    assert _look(known, ["a", "b", "c"], nodes) == []


def test_a_departed_registration_is_dropped_and_read_if_it_comes_back() -> None:
    known, nodes = Registrations(), {"a": _member("a1"), "b": _member("b1")}
    _look(known, ["a", "b"], nodes)
    assert _look(known, ["b"], nodes) == []
    nodes["a"] = _member("a2")
    assert _look(known, ["a", "b"], nodes) == ["a"]


def test_a_connection_state_change_makes_the_next_look_read_everything() -> None:
    known, nodes = Registrations(), {"a": _member("a1"), "b": _member("b1")}
    _look(known, ["a", "b"], nodes)
    known.forget()
    assert _look(known, ["a", "b"], nodes) == ["a", "b"]


def test_a_read_begun_before_a_forget_is_not_kept() -> None:
    """Its watch may have been lost with the connection: keeping it could keep it for ever."""
    known, nodes = Registrations(), {"a": _member("a1")}
    _, unread, generation = known.unread(["a"])
    known.forget()
    known.remember(generation, {name: nodes[name] for name in unread})
    assert _look(known, ["a"], nodes) == ["a"]


def test_a_registration_whose_read_found_no_node_is_read_at_the_next_look() -> None:
    known, nodes = Registrations(), {"b": _member("b1")}
    assert _look(known, ["a", "b"], nodes) == ["a", "b"]  # a deleted between listing and read
    nodes["a"] = _member("a1")
    assert _look(known, ["a", "b"], nodes) == ["a"]


def test_a_change_told_while_a_look_reads_is_read_again_at_the_next() -> None:
    """The read may have answered before the change: its notice must not be lost."""
    known, nodes = Registrations(), {"a": _member("a1")}
    _, unread, generation = known.unread(["a"])
    assert unread == ["a"]
    known.changed("a")  # the watch the read set fires before the look remembers
    nodes["a"] = _member("a2", version=1)
    known.remember(generation, {"a": _member("a1")})
    assert _look(known, ["a"], nodes) == ["a"]
