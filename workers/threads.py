"""Applying an instance's thread budget inside its worker (decided by the broker at load:
repository/threads.py, broker/lifecycle/threads.py).

A forked worker inherits a template that already imported numpy (and onnxruntime or torch),
so the BLAS and OpenMP runtimes in it read their thread variables long ago: setting the
environment alone would not resize them. So the pools already loaded are resized through
their own calls (what threadpoolctl does, without the dependency): OpenBLAS (numpy's and
scipy's bundled builds included), MKL, BLIS and OpenMP (GNU, Intel, LLVM), found among the
shared libraries this process has mapped, and PyTorch when it is imported. The variables are
set too, for the libraries a model imports later and for processes it starts. Runs at load,
once before the model loads and once after (for what its initialize imported); never per
request. Framework pools with a session of their own (ONNX Runtime, OpenVINO, TensorFlow)
take the budget from their backend.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys

from tritond.repository.threads import thread_env

log = logging.getLogger("tritond.worker")

# (what the library's file name contains, its setter symbols, its getter symbols): the first
# symbol a library exports is used.
_RUNTIMES: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("openblas", "openblas",
     ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
      "openblas_set_num_threads"),
     ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
      "openblas_get_num_threads")),
    ("mkl", "libmkl_rt", ("MKL_Set_Num_Threads",), ("MKL_Get_Max_Threads",)),
    ("blis", "libblis", ("bli_thread_set_num_threads",), ("bli_thread_get_num_threads",)),
    ("openmp", "libgomp", ("omp_set_num_threads",), ("omp_get_max_threads",)),
    ("openmp", "libiomp", ("omp_set_num_threads",), ("omp_get_max_threads",)),
    ("openmp", "libomp", ("omp_set_num_threads",), ("omp_get_max_threads",)),
)


def mapped_libraries(maps: str = "/proc/self/maps") -> list[str]:
    """The shared libraries this process has loaded, in load order."""
    seen: dict[str, None] = {}
    try:
        with open(maps) as f:
            for line in f:
                path = line.rstrip("\n").partition("/")[2]
                if path and ".so" in os.path.basename(path):
                    seen.setdefault("/" + path, None)
    except OSError:
        pass
    return list(seen)


def _symbol(lib: ctypes.CDLL, names: tuple[str, ...]):
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


def native_pools() -> list[tuple[str, str, object, object]]:
    """(runtime, library path, setter, getter) of each thread pool loaded in this process."""
    found = []
    for path in mapped_libraries():
        base = os.path.basename(path).lower()
        for runtime, marker, setters, getters in _RUNTIMES:
            if marker.lower() not in base:
                continue
            try:
                lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | ctypes.RTLD_LOCAL)
            except OSError:
                break
            setter, getter = _symbol(lib, setters), _symbol(lib, getters)
            if setter is not None:
                found.append((runtime, path, setter, getter))
            break
    return found


def pool_sizes() -> dict[str, int]:
    """Each loaded native pool's current thread count, by library file name (for logs and tests)."""
    sizes = {}
    for _, path, _, getter in native_pools():
        if getter is not None:
            getter.restype = ctypes.c_int
            sizes[os.path.basename(path)] = int(getter())
    return sizes


def apply_threads(threads: int, inter_op_threads: int = 0) -> list[str]:
    """Size this process's pools to `threads` (0: not budgeted, nothing changes); what was set."""
    if threads <= 0:
        return []
    os.environ.update(thread_env(threads))
    applied = ["environment"]
    for runtime, path, setter, _ in native_pools():
        try:
            setter(ctypes.c_int(threads))
        except Exception as e:     # a foreign library's call: report it, never fail the load for it
            log.warning("could not set the threads of %s (%s): %s", os.path.basename(path), runtime, e)
            continue
        applied.append(os.path.basename(path))
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(threads)
        applied.append("torch intra-op")
        if inter_op_threads > 0 and torch.get_num_interop_threads() != inter_op_threads:
            with contextlib.suppress(RuntimeError):     # settable only before its first parallel work
                torch.set_num_interop_threads(inter_op_threads)
                applied.append("torch inter-op")
    return applied
