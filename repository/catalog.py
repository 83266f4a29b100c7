"""What the repository offers: one ModelSpec per model, loadable or with the reason it is not.

A bad model never raises out of here; it becomes a spec with `error` set so the
server can list it as UNAVAILABLE and keep serving the others.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from tritonclient.grpc import model_config_pb2

from .advice import config_advice
from .backends import ENSEMBLE_PLATFORM
from .config import OVERRIDE_FILE, config_path, load_model_config, validate_config
from .validation import completes_its_config
from .ensemble import validate_ensemble
from .errors import ConfigError, UnpolledError
from .layout import ModelSource, ignored_version_dirs, scan, validate_model_name, version_dirs
from .model_metrics import model_metrics_warnings
from .python_based import DEFAULT_BACKEND_DIRECTORY
from .remote import RemoteError, is_remote, mirror_model
from .spec import ModelSpec
from .versions import select_versions

NO_VERSION = "no version is available"


def load_spec(
    source: ModelSource,
    *,
    autocomplete: bool = True,
    default_max_batch_size: int | Mapping[str, int] = 4,
    config_name: str = "",
    override: model_config_pb2.ModelConfig | None = None,
    backend_directory: str = DEFAULT_BACKEND_DIRECTORY,
) -> ModelSpec:
    """Load, validate and pick the versions of one model; failures land in `error`.
    `backend_directory` holds the Python-based backends."""

    def failed(error: str) -> ModelSpec:
        return ModelSpec(source.name, source.path, None, [], error)

    if source.error:
        return failed(source.error)
    bad_name = validate_model_name(source.name)
    if bad_name:
        return failed(bad_name)
    if is_remote(source.repo):
        try:
            mirror_model(source.repo, source.name)
        except RemoteError as e:
            return failed(str(e))
    try:
        cfg = load_model_config(
            source,
            autocomplete=autocomplete,
            default_max_batch_size=default_max_batch_size,
            config_name=config_name,
            override=override,
            backend_directory=backend_directory,
        )
        config_file = OVERRIDE_FILE if override is not None else config_path(source.path, config_name)
        # Triton validates the config before it looks at the directory name and the versions
        try:
            versions, version_error = select_versions(cfg, version_dirs(source.path)), None
        except ConfigError as e:
            versions, version_error = [], e
        io_pending = (autocomplete and bool(versions)
                      and completes_its_config(cfg, source.path, versions[0], backend_directory))
        validate_config(cfg, model_path=source.path, config_file=config_file, versions=versions,
                        io_pending=io_pending, directory=source.name, backend_directory=backend_directory)
        if version_error is not None:
            raise version_error
    except UnpolledError as e:
        return ModelSpec(source.name, source.path, None, [], str(e), unpolled=True)
    except ConfigError as e:
        return failed(str(e))
    if not versions:    # the directories it ignored say why, as Triton's warnings do
        return ModelSpec(source.name, source.path, None, [], NO_VERSION, advice=ignored_version_dirs(source.path))
    return ModelSpec(source.name, source.path, cfg, versions,
                     advice=ignored_version_dirs(source.path) + config_advice(cfg) + model_metrics_warnings(cfg))


def check_repository(
    repos: list[str], autocomplete: bool = True, *, default_max_batch_size: int | Mapping[str, int] = 4,
    config_name: str = "", backend_directory: str = DEFAULT_BACKEND_DIRECTORY,
) -> list[ModelSpec]:
    """Every model of the repositories, ensembles checked against their composing models, sorted by name."""
    specs = {
        name: load_spec(
            source,
            autocomplete=autocomplete,
            default_max_batch_size=default_max_batch_size,
            config_name=config_name,
            backend_directory=backend_directory,
        )
        for name, source in scan([os.fspath(r) for r in repos]).items()
    }
    changed = True
    while changed:  # an ensemble failing can fail an ensemble built on it
        changed = False
        for spec in specs.values():
            if spec.config is not None and spec.config.platform == ENSEMBLE_PLATFORM:
                error = validate_ensemble(spec.config, specs)
                if error:
                    spec.config, spec.versions, spec.error, spec.advice = None, [], error, []
                    changed = True
    return sorted(specs.values(), key=lambda s: s.name)
