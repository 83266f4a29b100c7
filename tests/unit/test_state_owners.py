"""One writer per state, and one shape of the request path, checked on the source with `ast`
(as test_import_direction checks imports), plus every transition an instance's state refuses."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tritond.broker.supervision.pool import TRANSITIONS, IllegalTransition, Instance, InstanceState

BROKER = Path(__file__).resolve().parents[2] / "broker"
# attribute -> the only modules that may assign it
OWNERS = {
    "state": {"tables/registry.py"},                    # ModelRegistry.set_state
    "_state": {"supervision/pool.py"},                  # Instance.move_to
    "_own_state": {"ensembles/plan.py"},                # EnsembleVersion (its own validity)
}
SCHEDULER_KINDS = {"Scheduler", "SequenceBatcher", "QueuedScheduling", "SequenceScheduling"}


def assignments(attr: str) -> list[str]:
    found = []
    for path in sorted(BROKER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and sub.attr == attr:
                        found.append(f"{path.relative_to(BROKER)}:{node.lineno}")
    return found


@pytest.mark.parametrize("attr", sorted(OWNERS))
def test_a_state_is_assigned_only_by_its_owner(attr):
    strays = [a for a in assignments(attr) if a.split(":")[0] not in OWNERS[attr]]
    assert strays == [], f"'{attr}' assigned outside {sorted(OWNERS[attr])}: {strays}"


def test_the_checker_sees_an_assignment():
    assert any(a.startswith("tables/registry.py:") for a in assignments("state"))


def test_no_isinstance_on_scheduler_kinds_outside_the_factory():
    strays = []
    for path in sorted(BROKER.rglob("*.py")):
        if path.name == "factory.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if names & SCHEDULER_KINDS:
                    strays.append(f"{path.relative_to(BROKER)}:{node.lineno}")
    assert strays == []


def _instance(state: InstanceState) -> Instance:
    inst = Instance("m", 1, 0, "m_0")
    path = {InstanceState.STARTING: [], InstanceState.READY: [InstanceState.READY],
            InstanceState.BUSY: [InstanceState.READY, InstanceState.BUSY],
            InstanceState.KILLED: [InstanceState.KILLED], InstanceState.RESTARTING: [InstanceState.RESTARTING],
            InstanceState.FAILED: [InstanceState.FAILED], InstanceState.STOPPING: [InstanceState.STOPPING],
            InstanceState.STOPPED: [InstanceState.STOPPED]}[state]
    for s in path:
        inst.move_to(s)
    assert inst.state is state
    return inst


LEGAL = [(a, b) for a in InstanceState for b in InstanceState if b is a or b in TRANSITIONS[a]]
ILLEGAL = [(a, b) for a in InstanceState for b in InstanceState if b is not a and b not in TRANSITIONS[a]]


@pytest.mark.parametrize("src,dst", LEGAL, ids=[f"{a.value}->{b.value}" for a, b in LEGAL])
def test_allowed_transitions(src, dst):
    inst = _instance(src)
    inst.move_to(dst)
    assert inst.state is dst


@pytest.mark.parametrize("src,dst", ILLEGAL, ids=[f"{a.value}->{b.value}" for a, b in ILLEGAL])
def test_every_other_transition_is_refused(src, dst):
    inst = _instance(src)
    with pytest.raises(IllegalTransition, match=f"from {src.value} to {dst.value}"):
        inst.move_to(dst)
    assert inst.state is src


def test_a_gone_worker_never_serves_again_without_a_new_generation():
    for gone in (InstanceState.STOPPED, InstanceState.FAILED, InstanceState.STOPPING, InstanceState.KILLED,
                 InstanceState.RESTARTING):
        assert not TRANSITIONS[gone] & {InstanceState.READY, InstanceState.BUSY}
    assert InstanceState.STARTING in TRANSITIONS[InstanceState.RESTARTING]


def test_state_cannot_be_assigned_directly():
    with pytest.raises(AttributeError):
        Instance("m", 1, 0, "m_0").state = InstanceState.READY
