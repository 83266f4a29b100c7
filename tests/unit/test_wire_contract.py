"""The wire contract (wire/contract.py): the Structs that cross between processes are the ones
recorded for this PROTOCOL_VERSION, and any change to one changes the fingerprint."""
from __future__ import annotations

import msgspec
import pytest

from tritond.wire import contract, replies, schema as S

RERECORD = "python -m tritond.wire.contract"


def test_the_wire_is_the_one_recorded_for_this_protocol_version():
    rows = contract.table()
    what = contract.changed(rows, contract.STRUCTS)
    assert contract.fingerprint(rows) == contract.SCHEMA_FINGERPRINT and not what, (
        f"the wire changed: {', '.join(what) or 'the recorded table was edited'}. Bump PROTOCOL_VERSION in "
        f"wire/schema.py (now {S.PROTOCOL_VERSION}) and re-record: {RERECORD} prints the new recorded section "
        f"of wire/contract.py")
    assert contract.RECORDED_VERSION == S.PROTOCOL_VERSION, (
        f"PROTOCOL_VERSION is {S.PROTOCOL_VERSION} but the contract was recorded for {contract.RECORDED_VERSION}: "
        f"re-record with {RERECORD}")


def test_every_struct_of_every_wire_module_is_found():
    found = contract.table()
    assert {"schema.Infer", "schema.ModelState", "errors.Code", "options.ServerOptions",
            "replies.MetricsReply"} <= found.keys()
    structs = [v for m in (S, replies) for v in vars(m).values()
               if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__ == m.__name__]
    assert {f"{c.__module__.rpartition('.')[2]}.{c.__qualname__}" for c in structs} <= found.keys()


def _spec(f: msgspec.structs.FieldInfo) -> tuple:
    if f.default is not msgspec.NODEFAULT:
        return f.name, f.type, f.default
    if f.default_factory is not msgspec.NODEFAULT:
        return f.name, f.type, msgspec.field(default_factory=f.default_factory)
    return f.name, f.type


def _infer(**changes) -> type:
    """A copy of schema.Infer with `changes`: `extra` fields, `swap` ones by name, or config."""
    swap = changes.pop("swap", {})
    fields = [swap.get(f.name, _spec(f)) for f in msgspec.structs.fields(S.Infer)] + changes.pop("extra", [])
    c = S.Infer.__struct_config__
    config = dict(tag=c.tag, array_like=c.array_like, omit_defaults=c.omit_defaults, gc=c.gc)
    config.update(changes)
    cls = msgspec.defstruct("Infer", fields, **config)
    cls.__module__ = S.__name__
    return cls


def _fingerprint_with(cls: type) -> tuple[str, list[str]]:
    rows = contract.table()
    others = [c for c in contract.discover() if c is not S.Infer]
    new = contract.table(others + [cls])
    return contract.fingerprint(new), contract.changed(new, rows)


def test_a_copy_of_a_struct_keeps_the_fingerprint():
    assert contract.describe(_infer()) == contract.describe(S.Infer)
    assert _fingerprint_with(_infer()) == (contract.fingerprint(contract.table()), [])


def test_any_change_to_a_struct_changes_the_fingerprint_and_names_it():
    before = contract.fingerprint(contract.table())
    for variant in (_infer(extra=[("hint", int, 0)]),          # a field added
                    _infer(swap={"rid": ("rid", str)}),        # a field's type
                    _infer(swap={"version": ("version", int, -2)}),    # its default
                    _infer(swap={"rid": ("request", int)}),    # its name
                    _infer(gc=not S.Infer.__struct_config__.gc),
                    _infer(array_like=False),
                    _infer(tag="inf"),
                    _infer(omit_defaults=False),
                    _infer(forbid_unknown_fields=True)):
        fingerprint, changed = _fingerprint_with(variant)
        assert fingerprint != before and changed == ["schema.Infer (changed)"], contract.describe(variant)


def test_defaults_and_factory_values_count_not_their_identity():
    a = msgspec.defstruct("P", [("xs", list[int], msgspec.field(default_factory=lambda: [1, 2]))])
    b = msgspec.defstruct("P", [("xs", list[int], msgspec.field(default_factory=lambda: [1, 2]))])
    c = msgspec.defstruct("P", [("xs", list[int], msgspec.field(default_factory=lambda: [1, 3]))])
    assert contract.describe(a) == contract.describe(b) != contract.describe(c)
    d = msgspec.defstruct("P", [("n", int, 1)])
    e = msgspec.defstruct("P", [("n", int, 2)])
    assert contract.describe(d) != contract.describe(e)


def test_a_new_struct_is_named():
    new = msgspec.defstruct("Hint", [("n", int)], tag="hint", array_like=True)
    new.__module__ = S.__name__
    rows = contract.table()
    assert contract.changed(contract.table(contract.discover() + [new]), rows) == ["schema.Hint (new)"]


def test_recording_refuses_a_changed_wire_under_the_same_version(monkeypatch):
    monkeypatch.setattr(contract, "SCHEMA_FINGERPRINT", "0" * 16)
    monkeypatch.setattr(contract, "RECORDED_VERSION", S.PROTOCOL_VERSION)
    with pytest.raises(SystemExit, match="bump PROTOCOL_VERSION"):
        contract.record()
    monkeypatch.setattr(contract, "RECORDED_VERSION", S.PROTOCOL_VERSION - 1)
    recorded: dict = {}
    exec(contract.record(), recorded)
    assert recorded["RECORDED_VERSION"] == S.PROTOCOL_VERSION
    assert recorded["SCHEMA_FINGERPRINT"] == contract.fingerprint(contract.table())
    assert recorded["STRUCTS"] == contract.table()
