"""Client-registered shared-memory regions on a request's path: every tensor a request places
in a region is bounds-checked and pointed at the region's segment before it is queued; the
regions stay in use until the request is answered, and workers are told to unmap a region
once it is unregistered and no request uses it."""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from tritond.shm.regions import CUDA, SYSTEM, RegionTable
from tritond.shm.regions import Region as ClientRegion
from tritond.wire.replies import CudaRegionStatus, CudaStatusReply, ShmStatusReply, SystemRegionStatus
from tritond.wire.schema import Infer, Region, TensorDesc

replace = msgspec.structs.replace


class ClientRegions:
    def __init__(self, unmap: Callable[[list[str]], None]) -> None:
        self.table = RegionTable()
        self._unmap = unmap          # tells every worker to drop its mappings of these keys

    def _place(self, loc: Region, used: list[ClientRegion]) -> Region:
        region, offset = self.table.resolve(loc.name, loc.offset, loc.nbytes)
        used.append(region)
        return Region(loc.name, offset, loc.nbytes, region.location)

    def resolve(self, msg: Infer) -> list[ClientRegion]:
        """Point every region tensor of `msg` at its segment (raises TritonError on a bad
        name or bounds); returns the regions to release when the request is answered."""
        used: list[ClientRegion] = []
        inputs = msg.inputs
        for i, d in enumerate(inputs):
            if isinstance(d.loc, Region):
                inputs[i] = TensorDesc(d.name, d.datatype, d.shape, self._place(d.loc, used))
        outputs = msg.outputs
        for i, o in enumerate(outputs):
            if o.region is not None:
                outputs[i] = replace(o, region=self._place(o.region, used))
        for r in used:
            self.table.acquire(r)
        return used

    def release(self, regions: list[ClientRegion]) -> None:
        keys: list[str] = []
        for r in regions:
            keys += self.table.release(r)
        if keys:
            self._unmap(keys)

    # ---------------------------------------------------------------- registration

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.table.register(name, key, offset, byte_size)

    def register_cuda(self, name: str, handle: bytes, device_id: int, byte_size: int) -> None:
        self.table.register_cuda(name, handle, device_id, byte_size)

    def unregister(self, name: str, kind: str) -> None:
        keys = self.table.unregister(name or None, kind)
        if keys:
            self._unmap(keys)

    def system_status(self, name: str) -> ShmStatusReply:
        return ShmStatusReply([SystemRegionStatus(r.name, r.key, r.offset, r.byte_size)
                               for r in self.table.listed(name or None, SYSTEM)])

    def cuda_status(self, name: str) -> CudaStatusReply:
        return CudaStatusReply([CudaRegionStatus(r.name, r.device_id, r.byte_size)
                                for r in self.table.listed(name or None, CUDA)])

