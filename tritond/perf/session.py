"""One measurement series against one model: reads the model's metadata and config, builds
the request bytes once (inline tensors, or tensors in registered system shared memory) and
measures a list of concurrency levels or request rates with the engine."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tritond.repository.datatypes import byte_size

from .control import Control, ControlError
from .engine import Driver, LevelResult, MeasureError, MeasureOptions, WindowCallback, measure_level
from .inputs import request_data
from .loadgen import Input, ShmRef, grpc_request, http_request, raw_bytes, run_blocking, split_target


@dataclass(frozen=True)
class PerfOptions:
    model: str
    url: str
    protocol: str = "http"
    version: str = ""
    batch_size: int = 1
    shapes: dict[str, list[int]] = field(default_factory=dict)
    input_data: str = "random"
    string_data: str | None = None
    string_length: int = 128
    shared_memory: str = "none"           # none | system
    output_shm_size: int = 102400
    input_format: str = "binary"          # HTTP only: binary | json
    request_distribution: str = "constant"
    measure: MeasureOptions = field(default_factory=MeasureOptions)


class SystemRegions:
    """The system shared-memory regions of one series: created, registered, and on close
    unregistered and destroyed (also after Ctrl-C), so nothing is left in /dev/shm."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self._handles: list[tuple[str, object]] = []
        self._prefix = f"tritond_perf_{os.getpid()}_{id(self):x}"

    def add(self, data: bytes | None, size: int) -> str:
        import tritonclient.utils.shared_memory as shm

        name = f"{self._prefix}_{len(self._handles)}"
        handle = shm.create_shared_memory_region(name, "/" + name, size)
        self._handles.append((name, handle))
        if data:
            shm.set_shared_memory_region(handle, [np.frombuffer(data, np.uint8)])
        self.control.register_system_shm(name, "/" + name, size)
        return name

    def close(self) -> None:
        import tritonclient.utils.shared_memory as shm

        for name, handle in reversed(self._handles):
            try:
                self.control.unregister_system_shm(name)
            except ControlError:
                pass   # the server may be gone; the region itself is still destroyed below
            shm.destroy_shared_memory_region(handle)
        self._handles.clear()


def _output_sizes(metadata: dict, max_batch_size: int, batch_size: int, default: int) -> dict[str, int]:
    """Bytes to reserve per output: exact for fixed shapes, `default` for BYTES or variable dims."""
    out = {}
    for t in metadata.get("outputs", []):
        dims = [int(d) for d in t["shape"]][1 if max_batch_size > 0 else 0:]
        if t["datatype"] == "BYTES" or any(d < 0 for d in dims):
            out[t["name"]] = default * batch_size
        else:
            out[t["name"]] = byte_size(t["datatype"], ([batch_size] if max_batch_size > 0 else []) + dims)
    return out


class PerfSession:
    """Request bytes for one model, ready to measure any number of levels."""

    def __init__(self, opts: PerfOptions, control: Control) -> None:
        self.opts = opts
        self.control = control
        self.regions: SystemRegions | None = None
        self.requests: list[bytes] = []

    def prepare(self) -> None:
        o = self.opts
        metadata = self.control.model_metadata(o.model, o.version)
        config = self.control.model_config(o.model, o.version)
        entries = request_data(metadata, int(config.get("max_batch_size", 0)), o.batch_size, o.shapes,
                               o.input_data, o.string_data, o.string_length)
        if o.shared_memory == "system":
            self.regions = SystemRegions(self.control)
            sizes = _output_sizes(metadata, int(config.get("max_batch_size", 0)), o.batch_size, o.output_shm_size)
            self.requests = [self._shm_request(inputs, sizes) for inputs in entries]
        else:
            self.requests = [self._request(inputs) for inputs in entries]

    def _request(self, inputs: list[Input], input_shm: dict[str, ShmRef] | None = None,
                 output_shm: dict[str, ShmRef] | None = None) -> bytes:
        o = self.opts
        if o.protocol == "http":
            host, port = split_target(o.url)
            return http_request(host, port, o.model, inputs, o.input_format == "binary", version=o.version,
                                input_shm=input_shm, output_shm=output_shm)
        return grpc_request(o.model, inputs, version=o.version, input_shm=input_shm, output_shm=output_shm)

    def _shm_request(self, inputs: list[Input], output_sizes: dict[str, int]) -> bytes:
        """Inputs laid one after another in one region, outputs likewise in another."""
        assert self.regions is not None
        raws = [raw_bytes(i) for i in inputs]
        region = self.regions.add(b"".join(raws), max(sum(len(r) for r in raws), 1))
        input_shm, offset = {}, 0
        for inp, raw in zip(inputs, raws):
            input_shm[inp.name] = ShmRef(region, len(raw), offset)
            offset += len(raw)
        out_region = self.regions.add(None, max(sum(output_sizes.values()), 1))
        output_shm, offset = {}, 0
        for name, size in output_sizes.items():
            output_shm[name] = ShmRef(out_region, size, offset)
            offset += size
        return self._request(inputs, input_shm, output_shm)

    async def run_async(self, mode: str, levels: Sequence[float],
                        on_start: Callable[[str, float], None] | None = None,
                        on_window: WindowCallback | None = None,
                        on_level: Callable[[LevelResult], None] | None = None) -> list[LevelResult]:
        """Measure each level in turn; a failing probe request stops before any measuring."""
        o = self.opts
        driver = Driver(o.url, o.protocol, self.requests)
        results: list[LevelResult] = []
        try:
            try:
                await driver.send_one()
            except Exception as exc:
                raise MeasureError(f"probe request to {o.url} failed: {exc}") from None
            for level in levels:
                if on_start is not None:
                    on_start(mode, level)
                result = await measure_level(driver, mode, level, o.measure, self.control, o.model, o.version,
                                             poisson=o.request_distribution == "poisson", on_window=on_window)
                results.append(result)
                if on_level is not None:
                    on_level(result)
        finally:
            await driver.close()
        return results

    def run(self, mode: str, levels: Sequence[float], **callbacks) -> list[LevelResult]:
        """Blocking run_async."""
        return run_blocking(self.run_async(mode, levels, **callbacks))

    def close(self) -> None:
        if self.regions is not None:
            self.regions.close()
            self.regions = None
