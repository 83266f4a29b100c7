"""An ensemble's own data flow, checked from its config alone, as Triton checks it when the
config is read (before its versions or composing models are looked at).

The graph is Triton's: each ensemble tensor is a node, a step links every tensor it reads to
every tensor it writes. Starting from the ensemble inputs, a tensor is ready once all the
tensors its step reads are; every ensemble output must become ready, and every other tensor
must be ready and read by some step.
"""
from __future__ import annotations

from collections import deque

from tritonclient.grpc import model_config_pb2


class _Tensor:
    __slots__ = ("name", "written", "ready", "reads", "feeds")

    def __init__(self, name: str, written: bool) -> None:
        self.name = name
        self.written = written
        self.ready = False
        self.reads: list[_Tensor] = []      # the tensors its step reads
        self.feeds: list[_Tensor] = []      # the tensors the steps reading it write


def _graph(cfg: model_config_pb2.ModelConfig) -> tuple[dict[str, _Tensor] | None, str | None]:
    name = cfg.name
    tensors: dict[str, _Tensor] = {}
    for i, step in enumerate(cfg.ensemble_scheduling.step):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                return None, f"must specify '{field}' in step {i} of ensemble '{name}'"
        written = []
        for tensor in step.output_map.values():
            node = tensors.get(tensor)
            if node is None:
                node = tensors[tensor] = _Tensor(tensor, True)
            elif node.written:
                return None, (f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble "
                              f"'{name}' step {i}")
            else:
                node.written = True
            written.append(node)
        for tensor in step.input_map.values():
            node = tensors.setdefault(tensor, _Tensor(tensor, False))
            for out in written:
                out.reads.append(node)
                node.feeds.append(out)
    return tensors, None


def flow_error(cfg: model_config_pb2.ModelConfig) -> str | None:
    """Triton's message for the first problem in the ensemble's steps and data flow, or None."""
    name = cfg.name
    if not cfg.ensemble_scheduling.step:
        return f"must specify 'step' for ensemble '{name}'"
    tensors, error = _graph(cfg)
    if tensors is None:
        return error
    queue: deque[_Tensor] = deque()
    for io in cfg.input:
        node = tensors.get(io.name)
        if node is None:
            return f"ensemble input '{io.name}' for ensemble {name}' is not used"
        node.ready = True
        queue.append(node)
    while queue:
        for nxt in queue.popleft().feeds:
            if not nxt.ready and all(r.ready for r in nxt.reads):
                nxt.ready = True
                queue.append(nxt)
    outputs = set()
    for io in cfg.output:
        node = tensors.get(io.name)
        if node is None:
            return f"ensemble output '{io.name}' for ensemble {name}' is not used"
        if not node.ready:
            return f"output '{io.name}' for ensemble '{name}' is not written" + _unconnected(node)
        outputs.add(io.name)
    for tensor, node in tensors.items():
        if tensor not in outputs and (not node.ready or not node.feeds):
            return f"ensemble tensor '{tensor}' is unused in ensemble '{name}'"
    return None


def _unconnected(output: _Tensor) -> str:
    """Where an output's missing input comes from: the furthest unready tensor up its chain."""
    last, reads, seen = output, output.reads, set()
    while reads:
        chain, reads = reads, []
        for node in chain:
            if not node.ready and node.name not in seen:
                seen.add(node.name)
                last, reads = node, node.reads
                break
    if last is output:
        return ""
    return f": at least one of its depending tensors, '{last.name}', is not connected"
