"""The response cache's digest of a request's inputs: Triton's key without the model and
version, which the broker adds. Frontends compute it where the bytes already are; the broker
computes it only for an ensemble step's request to a model that enables the cache (it holds
those inputs: the ensemble's, or earlier steps' outputs), so both find the same entries."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence


def inputs_digest(inputs: Iterable[tuple[str, str, Sequence[int], bytes | memoryview]]) -> bytes:
    """(name, datatype, shape, bytes) of every input, in name order."""
    h = hashlib.blake2b(digest_size=16)
    for name, datatype, shape, data in sorted(inputs, key=lambda t: t[0]):
        h.update(f"{name}\0{datatype}\0{','.join(map(str, shape))}\0{len(data)}\0".encode())
        h.update(data)
    return h.digest()
