"""The backend registry (repository/backends.py): every record is complete, and what used to be
separate tables (the worker factory, autofill, the warm templates, the memory check) agrees
with it."""
from __future__ import annotations

import configparser
import importlib
import types
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from tritond import memory
from tritond.broker.supervision.templates import template_kind
from tritond.repository import backends as registry
from tritond.repository.autofill import autofill_backend
from tritond.repository.backends import BACKENDS, UnknownBackend, backend_record, record_for
from tritond.repository.view import model_view
from tritond.wire.schema import WorkerSpec
from tritond.workers import template
from tritond.workers.backends import create
from tritond.workers.backends.base import Backend, InstanceInfo

ROOT = Path(__file__).resolve().parents[2]
RECORDS = pytest.mark.parametrize("record", BACKENDS, ids=[b.name for b in BACKENDS])


def extras() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return set(cfg["options.extras_require"])


def config_of(record) -> dict:
    return {"backend": record.name, "platform": record.platform}


@RECORDS
def test_every_record_is_complete(record):
    cls = getattr(importlib.import_module(record.worker_module), record.worker_class)
    assert issubclass(cls, Backend) and cls.name == record.name
    assert all(f.platform in record.platforms + ("",) for f in record.model_files)
    if record.forked:
        assert record.preload, "a forked backend needs a template that preloads it"
    if record.preload:
        assert record.preload[-1] == record.worker_module, "the template imports the backend's module"
    assert record.extra == "" or record.extra in extras()


def test_names_platforms_and_model_files_each_belong_to_one_backend():
    names = [b.name for b in BACKENDS]
    platforms = [p for b in BACKENDS for p in b.platforms]
    files = [f.name for b in BACKENDS for f in b.model_files]
    for values in (names, platforms, files):
        assert len(values) == len(set(values))
    assert registry.KNOWN_BACKENDS == tuple(names)


@RECORDS
def test_the_worker_factory_builds_the_records_class(record, tmp_path):
    config = config_of(record)
    backend = create(config, model_view(config), InstanceInfo("m", 1, str(tmp_path), str(tmp_path / "1"), "m_0_0"))
    assert type(backend).__name__ == record.worker_class
    if record.model_file:
        assert backend.model_path() == str(tmp_path / "1" / record.model_file)
    if record.platform:     # a config naming only the platform finds the same backend
        only = {"platform": record.platform}
        assert type(create(only, model_view(only), backend.instance)) is type(backend)


@RECORDS
def test_the_template_preloads_what_the_record_says(record, monkeypatch):
    imported = []
    monkeypatch.setattr(template, "importlib", types.SimpleNamespace(import_module=imported.append))
    monkeypatch.setattr(template, "gc", types.SimpleNamespace(collect=lambda: None, freeze=lambda: None))
    template.preload(record.name)
    assert imported == ["tritond.workers.main", *record.preload]


@RECORDS
def test_forked_records_are_what_the_broker_forks(record):
    spec = WorkerSpec("s", "ipc://x", "w", 1, "m", 1, "", "", "", config_of(record), "m_0", "CPU")
    assert template_kind(spec) == (record.name if record.forked else None)


@RECORDS
def test_the_memory_check_measures_the_records_kind(record):
    assert memory._kind(config_of(record)) == record.memory_kind
    assert memory._kind({"backend": record.name}) == record.memory_kind
    assert record.memory_kind in ("", record.name)


@RECORDS
def test_autofill_completes_a_config_from_the_record(record, tmp_path):
    cfg = model_config_pb2.ModelConfig(backend=record.name)
    autofill_backend(cfg, "m", None, "config.pbtxt")
    assert (cfg.platform, cfg.default_model_filename) == (record.platform, record.model_file)
    for f in record.model_files:        # each model file alone identifies the backend
        version = tmp_path / f.name.replace(".", "_") / "1"
        if f.directory:
            (version / f.name).mkdir(parents=True)
        else:
            version.mkdir(parents=True)
            (version / f.name).write_bytes(b"")
        found = model_config_pb2.ModelConfig()
        autofill_backend(found, "m", str(version), "config.pbtxt")
        filename = "" if record.name == "pytorch" else f.name       # as Triton's autofill leaves a found model.pt
        assert (found.backend, found.platform, found.default_model_filename) == (record.name, f.platform, filename)


def test_a_name_not_in_the_registry_is_a_clear_error(tmp_path):
    with pytest.raises(UnknownBackend, match="unknown backend 'caffe2'; tritond runs tensorflow, .*, identity"):
        backend_record("caffe2")
    with pytest.raises(UnknownBackend, match="unknown backend 'caffe2'"):
        template.preload("caffe2")
    assert record_for("caffe2", "") is None and memory._kind({"backend": "caffe2"}) == ""
    config = {"backend": "caffe2"}
    with pytest.raises(ValueError, match="unsupported backend 'caffe2'"):
        create(config, model_view(config), InstanceInfo("m", 1, str(tmp_path), str(tmp_path), "m_0_0"))


def test_a_python_based_backend_runs_on_the_python_backends_workers(tmp_path):
    config = {"backend": "vllm", "runtime": "model.py"}
    assert record_for("vllm", "", "model.py").name == "python" and model_view(config).backend == "python"
    assert memory._kind(config) == memory._kind({"backend": "python"})
