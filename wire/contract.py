"""The wire contract: a fingerprint of every msgspec Struct (and enum) defined in tritond.wire,
recorded for the PROTOCOL_VERSION it belongs to.

Processes of one server check each other's PROTOCOL_VERSION (Hello, WorkerUp), so a change to
what crosses between them that keeps the version makes two builds misread each other's frames
instead of refusing each other. Each Struct's row describes what decides its encoding: its
name, its fields in order (name, encoded name, type as text, default, default_factory's value),
tag and tag_field, array_like, omit_defaults, gc and forbid_unknown_fields; an enum's row lists
its members' values. tests/unit/test_wire_contract.py recomputes the rows and fails, naming the
changed Structs, until PROTOCOL_VERSION is bumped and the table re-recorded:

    python -m tritond.wire.contract     # prints RECORDED_VERSION, SCHEMA_FINGERPRINT and STRUCTS

The modules are walked, so a new Struct is in the table without being listed anywhere.
"""
from __future__ import annotations

import enum
import hashlib
import importlib
import pkgutil
import sys
import types
import typing
from collections.abc import Iterable

import msgspec

from .schema import PROTOCOL_VERSION


def _type_text(tp: object) -> str:
    """A field's type as text that does not depend on how it was spelt (X | None, Optional[X])."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None:
        return f"{getattr(origin, '__name__', repr(origin))}[{', '.join(_type_text(a) for a in args)}]"
    if tp is type(None):
        return "None"
    if tp is typing.Any:
        return "Any"
    return getattr(tp, "__qualname__", repr(tp))


def describe(cls: type) -> str:
    """One Struct's or enum's row."""
    if issubclass(cls, enum.Enum):
        return f"enum {cls.__name__}: " + ", ".join(f"{m.name}={m.value!r}" for m in cls)
    c = cls.__struct_config__
    head = (f"{cls.__name__} tag={c.tag!r} tag_field={c.tag_field!r} array_like={c.array_like} "
            f"omit_defaults={c.omit_defaults} gc={c.gc} forbid_unknown_fields={c.forbid_unknown_fields}")
    fields = []
    for f in msgspec.structs.fields(cls):
        text = f.name if f.encode_name == f.name else f"{f.name} (as {f.encode_name!r})"
        text += f": {_type_text(f.type)}"
        if f.default is not msgspec.NODEFAULT:
            text += f" = {f.default!r}"
        elif f.default_factory is not msgspec.NODEFAULT:
            text += f" = factory {f.default_factory()!r}"
        fields.append(text)
    return head + " | " + "; ".join(fields)


def discover() -> list[type]:
    """Every Struct and enum class defined in a module of tritond.wire."""
    package = sys.modules[__package__]
    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__package__}.{info.name}")
        for value in vars(module).values():
            if (isinstance(value, type) and value.__module__ == module.__name__
                    and issubclass(value, (msgspec.Struct, enum.Enum))):
                found.append(value)
    return found


def table(classes: Iterable[type] | None = None) -> dict[str, str]:
    """`module.Name` -> digest of its row, for `classes` (default: every one of tritond.wire)."""
    out = {}
    for cls in discover() if classes is None else classes:
        name = f"{cls.__module__.rpartition('.')[2]}.{cls.__qualname__}"
        out[name] = hashlib.sha256(describe(cls).encode()).hexdigest()[:12]
    return dict(sorted(out.items()))


def fingerprint(rows: dict[str, str]) -> str:
    return hashlib.sha256("".join(f"{k} {v}\n" for k, v in sorted(rows.items())).encode()).hexdigest()[:16]


def changed(rows: dict[str, str], recorded: dict[str, str]) -> list[str]:
    """The Structs added, removed or changed since `recorded`, each with what happened."""
    out = [f"{k} (new)" for k in rows if k not in recorded]
    out += [f"{k} (removed)" for k in recorded if k not in rows]
    out += [f"{k} (changed)" for k in rows if k in recorded and rows[k] != recorded[k]]
    return sorted(out)


def record() -> str:
    """The recorded section of this module for the Structs as they are now. Refuses when they
    changed but PROTOCOL_VERSION did not."""
    rows = table()
    if fingerprint(rows) != SCHEMA_FINGERPRINT and PROTOCOL_VERSION == RECORDED_VERSION:
        raise SystemExit(f"the wire changed ({', '.join(changed(rows, STRUCTS))}): bump PROTOCOL_VERSION "
                         f"in wire/schema.py (now {PROTOCOL_VERSION}) before recording")
    lines = [f"RECORDED_VERSION = {PROTOCOL_VERSION}", f'SCHEMA_FINGERPRINT = "{fingerprint(rows)}"',
             "STRUCTS = {"]
    lines += [f'    "{k}": "{v}",' for k, v in rows.items()]
    return "\n".join(lines + ["}"])


# ---------------------------------------------------------------- recorded by `python -m tritond.wire.contract`

RECORDED_VERSION = 21
SCHEMA_FINGERPRINT = "a6cc14c721462b1a"
STRUCTS = {
    "errors.Code": "6e686da91e90",
    "options.HttpLimitsConfig": "95894af5226a",
    "options.MetricsConfig": "316263254ca0",
    "options.OpenAIConfig": "e7658b91b545",
    "options.OtelConfig": "49c6ec3bfd03",
    "options.ServerOptions": "1feef84906ff",
    "options.TlsConfig": "73eb470ed7ce",
    "options.TraceConfig": "061be6043fab",
    "options._O": "7157e6c72e21",
    "replies.CacheUsage": "f093277b05fb",
    "replies.CudaRegionStatus": "0580eec181ff",
    "replies.CudaStatusReply": "738600b0a982",
    "replies.CustomFamily": "8bc82e274bb6",
    "replies.CustomMetric": "b9a6f94c0ba7",
    "replies.DrainReply": "b8d15379d646",
    "replies.HistogramSnapshot": "46d892019300",
    "replies.IndexReply": "d4bf83dc3271",
    "replies.InferBatchStatistics": "d52350c1daf8",
    "replies.InferResponseStatistics": "12e85bd65d48",
    "replies.InferStatistics": "98641e9f4490",
    "replies.LatencySummaries": "85f521bd22a1",
    "replies.LogSettingValues": "875b5f815d07",
    "replies.LogSettingsReply": "78e6c2dc92ff",
    "replies.MemoryUsage": "63c43abeec08",
    "replies.MetricId": "b8f9722d7695",
    "replies.MetricValue": "09b5558a1ecd",
    "replies.MetricsReply": "0de0103e835d",
    "replies.ModelIndex": "a49661f17d9b",
    "replies.ModelPaging": "272a7b7bdf31",
    "replies.ModelSnapshot": "5ca587e5bf74",
    "replies.ModelStatistics": "e666ec69828b",
    "replies.PagingSnapshot": "709758069442",
    "replies.PagingStatistics": "43f6dbc5ca27",
    "replies.Peer": "bf95b1aaf7cb",
    "replies.ReadyReply": "c13dba1a8499",
    "replies.ShmStatusReply": "9fb7c49e7970",
    "replies.StatisticDuration": "4e22c5955dbd",
    "replies.StatsReply": "d98181d22ba3",
    "replies.SummarySnapshot": "a6b1c22cb3b1",
    "replies.SystemRegionStatus": "72a2516c9bfa",
    "replies.TraceSettingsReply": "853e9ed110d6",
    "replies.WorkerProcess": "5ae384a67478",
    "replies._Reply": "2eb1ac50ac76",
    "schema.BatchDone": "657595b8e8f4",
    "schema.Block": "0edf3c5fc80e",
    "schema.Cancel": "50244795d415",
    "schema.CancelKeys": "9756f858b74c",
    "schema.CheckReady": "1fc45fb248bc",
    "schema.Control": "023d494ae945",
    "schema.ControlReply": "cb6f26aebf3d",
    "schema.Credit": "88f793de77ae",
    "schema.CudaRegister": "926e16296c69",
    "schema.CudaStatus": "6e9958293735",
    "schema.CudaUnregister": "056238bfe13e",
    "schema.Device": "8709f71970d8",
    "schema.Drain": "1e4425faf4ec",
    "schema.DynamicBatching": "9e5b09b801a6",
    "schema.EndSequences": "4bca449d0908",
    "schema.Exec": "5eeb574013b2",
    "schema.ExecRequest": "e49d08f6188b",
    "schema.ExecResult": "e5ac0e3be47c",
    "schema.Gone": "da0ed2334bd4",
    "schema.Grant": "e2f4cbac8b36",
    "schema.Heartbeat": "8342a9b93715",
    "schema.Hello": "7e69f3240178",
    "schema.Infer": "f34bf0615e74",
    "schema.InferReply": "3a5ce77539fe",
    "schema.Inline": "d3262ce55494",
    "schema.LoadModel": "6e2ca930ed77",
    "schema.LogConfig": "bf32f47a4950",
    "schema.LogSettings": "c27f322f81cd",
    "schema.MetricDrop": "3cbfeb99b1ab",
    "schema.MetricFamilyNew": "e3519a5bdc34",
    "schema.MetricNew": "03da38903e5b",
    "schema.MetricOp": "5614779fcc90",
    "schema.ModelEntry": "75ab500160e8",
    "schema.ModelMetrics": "ce76418c8048",
    "schema.ModelReady": "9363239bf43b",
    "schema.ModelState": "b5f00a2f0916",
    "schema.ModelView": "4dfa064d3ea4",
    "schema.Observe": "cf5b68c05842",
    "schema.OutputSpec": "eac7cb9d2f95",
    "schema.Ping": "7bfebfd127b6",
    "schema.QueuePolicy": "722f977b426a",
    "schema.ReadyResult": "796f3b1daab9",
    "schema.Refused": "d0821810c43c",
    "schema.Region": "ad648749f1bc",
    "schema.Release": "4b2da5d25523",
    "schema.ReopenLog": "f5eede3629a5",
    "schema.Replies": "c7af2bc26e11",
    "schema.RepositoryIndex": "3fbf08cb0846",
    "schema.Respond": "09889cd8122e",
    "schema.RunTimes": "c6b95bc2a49b",
    "schema.SequenceBatching": "f817b93d482c",
    "schema.SequenceControl": "104bf64d4f95",
    "schema.ShmRegister": "f432e118c9a0",
    "schema.ShmStatus": "abb388cb136f",
    "schema.ShmUnregister": "1348f7fc2bea",
    "schema.Stamp": "8bd89c6d5cbd",
    "schema.Statistics": "55bbfda560d3",
    "schema.Stop": "5638d88e5237",
    "schema.StopServer": "58afb439f072",
    "schema.Table": "b5b80765e131",
    "schema.TensorDesc": "afec35b544ee",
    "schema.TensorView": "019b9e66a2f9",
    "schema.TraceChild": "554c631d55c9",
    "schema.TraceDone": "cc709f09aa90",
    "schema.TraceInfo": "6ccce6aa7afb",
    "schema.TraceRef": "b564995f629d",
    "schema.TraceSettings": "b0c53733faa6",
    "schema.TraceStart": "93869966e5fc",
    "schema.UnloadModel": "de5d0537b224",
    "schema.Unmap": "c458b2102b7e",
    "schema.WorkerDown": "6fcc156705c0",
    "schema.WorkerSpec": "c8d3408cfcab",
    "schema.WorkerUp": "051d5cecb398",
    "schema.Zeros": "9cd0d19aa965",
    "schema._S": "c4554829a979",
}


if __name__ == "__main__":
    print(record())
