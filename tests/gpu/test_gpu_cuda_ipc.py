"""CUDA IPC hand-off between two worker processes: a producer's PyTorch backend keeps its
output on the GPU and exports it by handle; a consumer process opens the handle and feeds it
to its own backend, with no host copy on the way. The producer holds the allocation until
the consumer has released its lease."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tritond.repository.devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

if gpu_count() == 0:
    pytest.skip("no GPU: nvidia-smi lists none", allow_module_level=True)
torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip(f"torch {torch.__version__} cannot use the GPU", allow_module_level=True)
pytest.importorskip("cuda.bindings.runtime", reason="cuda-python (cuda.bindings) is not installed")

# A worker-like process: a PyTorch backend on cuda:0 for `y = x * SCALE + SHIFT`.
COMMON = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import torch
    from tritond.repository.view import model_view
    from tritond.workers.backends import create
    from tritond.workers.backends.base import InstanceInfo, WorkerRequest
    from tritond.workers import cuda_ipc

    class Affine(torch.nn.Module):
        def __init__(self, scale: float, shift: float):
            super().__init__()
            self.scale, self.shift = scale, shift

        def forward(self, x):
            return x * self.scale + self.shift

    def backend(tmp, scale, shift, device_out):
        version = os.path.join(tmp, "1")
        os.makedirs(version, exist_ok=True)
        torch.jit.save(torch.jit.script(Affine(scale, shift)), os.path.join(version, "model.pt"))
        config = {"name": "m", "platform": "pytorch_libtorch", "max_batch_size": 0,
                  "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [-1]}],
                  "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [-1]}],
                  "parameters": {"cuda_ipc_outputs": {"string_value": "true" if device_out else "false"}}}
        b = create(config, model_view(config), InstanceInfo("m", 1, tmp, version, "m_0_0", kind="GPU"))
        b.load()
        return b
""")

PRODUCER = COMMON + textwrap.dedent("""
    b = backend(sys.argv[1], 2.0, 1.0, True)
    x = np.arange(1 << 16, dtype=np.float32)
    (resp,) = b.execute([WorkerRequest({"INPUT__0": x}, [])])
    out = resp.outputs["OUTPUT__0"]
    exports = cuda_ipc.Exports()
    lease = exports.add([out], holders=1)
    ref = cuda_ipc.export(out)
    print(json.dumps({"handle": ref.handle.hex(), "offset": ref.offset, "nbytes": ref.nbytes, "device": ref.device,
                      "shape": list(out.shape), "dtype": out.dtype.str, "lease": lease}), flush=True)
    assert sys.stdin.readline().strip() == f"release {lease}"
    assert exports.release(lease) and len(exports) == 0
    print("released", flush=True)
""")

CONSUMER = COMMON + textwrap.dedent("""
    msg = json.loads(sys.stdin.readline())
    b = backend(sys.argv[1], 1.0, 3.0, False)
    imports = cuda_ipc.Imports()
    ref = cuda_ipc.IpcRef(bytes.fromhex(msg["handle"]), msg["offset"], msg["nbytes"], msg["device"])
    arr = imports.open(ref, msg["shape"], np.dtype(msg["dtype"]))
    (resp,) = b.execute([WorkerRequest({"INPUT__0": arr}, [])])
    out = resp.outputs["OUTPUT__0"]
    imports.close()
    print(json.dumps({"first": out[:4].tolist(), "sum": float(out.astype(np.float64).sum()),
                      "opened_on_device": True}), flush=True)
""")


def spawn(code: str, tmp: str) -> subprocess.Popen:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    return subprocess.Popen([sys.executable, "-c", code, tmp], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_device_tensor_handed_over_by_ipc_handle(tmp_path):
    producer = spawn(PRODUCER, str(tmp_path / "producer"))
    consumer = spawn(CONSUMER, str(tmp_path / "consumer"))
    try:
        line = producer.stdout.readline()
        assert line, producer.stderr.read()
        ref = json.loads(line)
        assert len(bytes.fromhex(ref["handle"])) == 64 and ref["nbytes"] == 4 << 16
        consumer.stdin.write(line)
        consumer.stdin.flush()
        out, err = consumer.communicate(timeout=300)
        assert consumer.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        x = np.arange(1 << 16, dtype=np.float64)
        assert result["first"] == [(v * 2 + 1) + 3 for v in range(4)]
        assert result["sum"] == pytest.approx(float(((x * 2 + 1) + 3).sum()), rel=1e-6)
        producer.stdin.write(f"release {ref['lease']}\n")
        producer.stdin.flush()
        out, err = producer.communicate(timeout=120)
        assert producer.returncode == 0 and out.strip() == "released", err
    finally:
        for p in (producer, consumer):
            if p.poll() is None:
                p.kill()
                p.wait()
