"""Output leases held by frontend processes, so that a frontend's death frees them at once.

A reply's outputs stay in the worker's arena until the frontend that rendered them releases
them by message. A frontend killed in between would leave those blocks allocated until the
worker itself restarts. So the broker notes which leases each frontend holds (only replies
with leased outputs cost anything), watches each frontend process through a pidfd opened
when it says hello, and when one dies releases what it held; replies for a frontend already
gone are released instead of sent into the void.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import KeysView

from tritond.wire.schema import InferReply, Release, lease_of


class FrontendLeases:
    def __init__(self) -> None:
        self.held: dict[bytes, Counter[tuple[bytes, int]]] = {}
        self._fds: dict[int, bytes] = {}        # pidfd -> frontend identity
        self._gone: set[bytes] = set()
        self.fds_changed = False                # the broker's loop re-registers the pidfds then

    def hello(self, ident: bytes, pid: int) -> None:
        """A frontend process introduced itself: watch it."""
        if ident in self._fds.values():
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:         # already gone, or not ours to watch
            return
        self._fds[fd] = ident
        self.fds_changed = True

    def pidfds(self) -> KeysView[int]:
        """A live view, no copy."""
        return self._fds.keys()

    def sent(self, ident: bytes, reply: InferReply) -> Release | None:
        """Note the leases of a reply sent to `ident`; for a frontend that is gone, the
        release to route instead."""
        leases = None
        for d in reply.outputs:
            lease = lease_of(d)
            if lease:
                if leases is None:
                    leases = set()
                leases.add(lease)
        if leases is None:      # inline outputs: nothing to hold
            return None
        if ident in self._gone:
            return Release(reply.owner, sorted(leases))
        held = self.held.setdefault(ident, Counter())
        for lease in leases:
            held[(reply.owner, lease)] += 1
        return None

    def released(self, ident: bytes, msg: Release) -> None:
        held = self.held.get(ident)
        if held is None:
            return
        for lease in msg.leases:
            key = (msg.owner, lease)
            if held[key] > 1:
                held[key] -= 1
            else:
                held.pop(key, None)

    def exited(self, fd: int) -> tuple[bytes, list[Release]]:
        """The frontend behind `fd` died: (its identity, the releases of what it held)."""
        ident = self._fds.pop(fd)
        self.fds_changed = True
        os.close(fd)
        self._gone.add(ident)
        by_owner: dict[bytes, list[int]] = {}
        for (owner, lease), count in self.held.pop(ident, Counter()).items():
            by_owner.setdefault(owner, []).extend([lease] * count)
        return ident, [Release(owner, leases) for owner, leases in by_owner.items()]

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
