"""Business-logic scripting: a python model calling another model through the broker.

The calling worker sends an ordinary Infer to the broker on its own socket and blocks for
the reply while other workers serve the callee, so no worker ever waits on itself.
"""
from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from tritond.broker import protocol as P
from tritond.repository.datatypes import array_to_bytes, numpy_to_wire

from .tensors import desc_to_array

if TYPE_CHECKING:
    from .main import Worker


class BlsClient:
    def __init__(self, worker: "Worker") -> None:
        self.w = worker
        self.lock = threading.Lock()
        self.rids = itertools.count(1)
        self.replies: dict[int, P.InferReply] = {}

    def stray(self, msg: Any) -> None:
        if isinstance(msg, P.InferReply):
            self.replies[msg.rid] = msg

    def infer(self, model_name: str, model_version: int, inputs: dict[str, np.ndarray],
              requested_output_names: list[str], request_id: str, parameters: dict,
              correlation_id: Any, flags: int, timeout_us: int) -> tuple[dict[str, np.ndarray], tuple[str, str] | None]:
        w = self.w
        blocks = []
        descs = []
        for name, arr in inputs.items():
            arr = np.asarray(arr)
            datatype = numpy_to_wire(arr.dtype)
            payload = array_to_bytes(arr, datatype)
            size = len(payload) if isinstance(payload, bytes) else payload.nbytes
            desc = P.TensorDesc(name, datatype, list(arr.shape))
            if size <= P.INLINE_MAX:
                desc.data = bytes(payload)
            else:
                block = w.arena.alloc(size)
                block.view[:size] = payload
                blocks.append(block)
                desc.seg, desc.offset, desc.nbytes = block.seg, block.offset, size
            descs.append(desc)
        with self.lock:
            rid = next(self.rids)
            w.send(P.Infer(rid, model_name, int(model_version), descs,
                           [P.OutputSpec(n) for n in requested_output_names], request_id,
                           dict(parameters or {}), 0, int(timeout_us or 0), correlation_id or 0, int(flags or 0)))
            while rid not in self.replies:
                msg = w.decoder.decode(w.sock.recv())
                if not w.handle_side(msg):
                    self.stray(msg)
            reply = self.replies.pop(rid)
        for block in blocks:
            w.arena.free(block.seg, block.offset)
        if reply.error is not None:
            return {}, (reply.error.code, reply.error.message)
        outputs = {d.name: np.array(desc_to_array(d, w.maps), copy=True) for d in reply.outputs}
        leases = sorted({d.lease for d in reply.outputs if d.lease})
        if leases:
            w.send(P.Release(reply.owner, leases))
        return outputs, None
