"""The rate limiter (`--rate-limit=execution_count`): an instance executes a batch only while the
resources its instance group names (`rate_limiter { resources [...] priority }`) are free.

The broker is the single place that grants them, so resources shared across models hold
across every worker process. As in Triton: a resource is per device unless `global`; what
is available of it is the most any one instance needs, or what `--rate-limit-resource
<name>:<count>[:<device>]` says (once that flag is given, every resource a model uses must be
listed, and enough of it); when resources free up, waiting instances are served lowest
`(executions + 1) x priority` first (priority 0 counts as 1), the higher priority (the lower
number) on a tie, so priority 2 gets every third turn against priority 1 from the first. With `--rate-limit=off` (the default) resources and priorities are ignored.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tritond.broker.supervision.pool import Instance

if TYPE_CHECKING:
    from tritond.broker.tables.model_version import ModelVersion

log = logging.getLogger("tritond.broker")

GLOBAL = -2
ANY_DEVICE = -1

Key = tuple[str, int]          # (resource, device or GLOBAL)


def parse_resources(specs: Iterable[str]) -> dict[Key, int]:
    """`<name>:<count>[:<device>]` -> {(name, device or ANY_DEVICE): count}; raises ValueError."""
    out: dict[Key, int] = {}
    for spec in specs:
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not all(p.strip().isdigit() for p in parts[1:]):
            raise ValueError(f"--rate-limit-resource '{spec}': expected <name>:<count>[:<device>]")
        device = int(parts[2]) if len(parts) == 3 else ANY_DEVICE
        out[(parts[0], device)] = int(parts[1])
    return out


def instance_needs(config: dict[str, Any], inst: Instance) -> tuple[dict[Key, int], int]:
    """The resources one instance needs per execution, and its priority."""
    groups = config.get("instance_group") or []
    limiter = (groups[inst.group].get("rate_limiter") or {}) if inst.group < len(groups) else {}
    needs: dict[Key, int] = {}
    for r in limiter.get("resources") or []:
        key = (str(r["name"]), GLOBAL if r.get("global") else inst.device_id)
        needs[key] = needs.get(key, 0) + int(r.get("count", 0) or 0)
    return {k: n for k, n in needs.items() if n > 0}, max(1, int(limiter.get("priority", 0) or 0))


class RateLimiter:
    def __init__(self, explicit: dict[Key, int] | None = None) -> None:
        self.explicit = dict(explicit or {})
        self.needs: dict[Instance, dict[Key, int]] = {}
        self.priority: dict[Instance, int] = {}
        self.executions: dict[Instance, int] = {}
        self.capacity: dict[Key, int] = {}
        self.used: dict[Key, int] = {}
        self.grants: dict[int, Instance] = {}            # batch id -> the instance holding resources
        self.waiting: list["ModelVersion"] = []

    # ---------------------------------------------------------------- registration

    def register(self, mv: "ModelVersion") -> str:
        """Note what `mv`'s instances need; the reason it cannot be scheduled ('' when it can)."""
        added = {inst: instance_needs(mv.config or {}, inst) for inst in mv.instances if not inst.leaving}
        refused = self._refusal(added)
        if refused:
            return refused
        for inst, (needs, priority) in added.items():
            self.needs[inst] = needs
            self.priority[inst] = priority
            self.executions.setdefault(inst, 0)
        self._recompute()
        return ""

    def refusal(self, config: dict[str, Any], instances: list[Instance]) -> str:
        """Why these instances of this config could not be scheduled ('' when they could)."""
        return self._refusal({inst: instance_needs(config, inst) for inst in instances})

    def _refusal(self, added: dict[Instance, tuple[dict[Key, int], int]]) -> str:
        keys = {k for needs, _ in added.values() for k in needs} | {k for n in self.needs.values() for k in n}
        names = {(name, dev == GLOBAL) for name, dev in keys}
        for name, _ in names:
            if (name, True) in names and (name, False) in names:
                return (f'Resource "{name}" is present as both global and device-specific resource in the '
                        f"model configuration.")
        for needs, _ in added.values():
            for key, n in needs.items():
                have = self._explicit(key)
                if have is not None and have < n:
                    return (f'Resource count for "{key[0]}" is limited to {have} which will prevent scheduling '
                            f"of one or more model instances, the minimum required count is {n}")
        return ""

    def forget(self, inst: Instance) -> None:
        """An instance removed from its version has stopped (its last grant was released)."""
        self.needs.pop(inst, None)
        self.priority.pop(inst, None)
        self.executions.pop(inst, None)
        self._recompute()

    def unregister(self, mv: "ModelVersion") -> None:
        for inst in mv.instances:
            self.needs.pop(inst, None)
            self.priority.pop(inst, None)
            self.executions.pop(inst, None)
        if mv in self.waiting:
            self.waiting.remove(mv)
        self._recompute()

    def _explicit(self, key: Key) -> int | None:
        """What --rate-limit-resource makes available of `key` (None: the flag was not given)."""
        if not self.explicit:
            return None
        name, device = key
        if device == GLOBAL:
            return max((n for (r, _), n in self.explicit.items() if r == name), default=0)
        return max(self.explicit.get((name, device), 0), self.explicit.get((name, ANY_DEVICE), 0))

    def _recompute(self) -> None:
        cap: dict[Key, int] = {}
        for needs in self.needs.values():
            for key, n in needs.items():
                cap[key] = max(cap.get(key, 0), n)
        capacity = {k: (self._explicit(k) if self.explicit else n) for k, n in cap.items()}
        if capacity != self.capacity and log.isEnabledFor(logging.DEBUG):
            # Triton's verbose lines; its escaped log writes the tab as "\\t", which scripts grep for
            for (name, device), n in sorted(capacity.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
                log.debug("Resource: %s\t Count: %d%s", name, n, "" if device == GLOBAL else f"\t Device: {device}")
        self.capacity = capacity

    # ---------------------------------------------------------------- granting

    def free(self, inst: Instance) -> bool:
        needs = self.needs.get(inst)
        return not needs or all(self.used.get(k, 0) + n <= self.capacity.get(k, 0) for k, n in needs.items())

    def scaled(self, inst: Instance) -> tuple[int, int]:
        """The order in which waiting instances are served: the turn this execution would be
        at its priority, then the priority itself."""
        priority = self.priority.get(inst, 1)
        return (self.executions.get(inst, 0) + 1) * priority, priority

    def grantable(self, mv: "ModelVersion", free: list[Instance]) -> list[Instance]:
        """Of `mv`'s idle instances, those whose resources are free, best first; when none,
        `mv` waits for a release."""
        ok = sorted((i for i in free if self.free(i)), key=self.scaled)
        if not ok and free and mv not in self.waiting:
            self.waiting.append(mv)
        return ok

    def acquire(self, inst: Instance, bid: int) -> None:
        for key, n in self.needs.get(inst, {}).items():
            self.used[key] = self.used.get(key, 0) + n
        self.executions[inst] = self.executions.get(inst, 0) + 1
        self.grants[bid] = inst

    def release(self, bid: int | None) -> bool:
        """Free the resources batch `bid` held; True when it held any."""
        inst = self.grants.pop(bid, None) if bid is not None else None
        if inst is None:
            return False
        for key, n in self.needs.get(inst, {}).items():
            self.used[key] = max(0, self.used.get(key, 0) - n)
        return True

    def woken(self, also: "ModelVersion") -> list["ModelVersion"]:
        """The versions to offer freed resources to, best candidate first (`also`, the version
        whose batch just ended, competes like the ones waiting)."""
        candidates = self.waiting + ([also] if also not in self.waiting else [])
        self.waiting = []

        def best(mv: "ModelVersion") -> tuple[int, int]:
            return min((self.scaled(i) for i in mv.free_instances()), default=(1 << 62, 0))
        return sorted(candidates, key=best)
