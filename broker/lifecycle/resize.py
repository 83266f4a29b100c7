"""A load that changes nothing but a model's instance groups updates its instances in place,
as Triton does: an instance whose settings are unchanged keeps running (with whatever state
its model holds), each instance the new groups add starts beside them, and each they no longer
ask for takes no more work and stops once its batch is done. Settings are an instance group
without its name and count (kind, device, rate limiter, ...), so renaming or regrouping
instances changes nothing; a removed instance that holds sequences runs them to their end
first. A changed model file or any other config field reloads the model (reload.py)."""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from tritond.broker.lifecycle.reload import LoadedFrom
from tritond.broker.lifecycle.version_state import instances_of
from tritond.broker.supervision.pool import Instance
from tritond.broker.tables.model_version import READY, ModelVersion

_NOT_SETTINGS = ("name", "count", "gpus")


def only_instances_changed(before: LoadedFrom | None, now: LoadedFrom, old: dict[int, ModelVersion],
                           versions: list[int]) -> bool:
    """Whether `now` differs from `before` in its instance groups alone, over the same files,
    with every version it keeps serving."""
    if before is None or before.path != now.path or before.fingerprint is None or now.fingerprint is None:
        return False
    if before.fingerprint.shared != now.fingerprint.shared or before.fingerprint.versions != now.fingerprint.versions:
        return False
    rest = lambda config: {k: v for k, v in config.items() if k != "instance_group"}  # noqa: E731
    if rest(before.config) != rest(now.config) or before.config.get("instance_group") == now.config.get(
            "instance_group"):
        return False
    return (sorted(old) == sorted(versions)
            and all(mv.state == READY and not mv.restarting and not mv.view.ensemble and mv.scheduler is not None
                    for mv in old.values()))


def settings(config: dict[str, Any], inst: Instance) -> str:
    groups = config.get("instance_group") or []
    group = groups[inst.group] if inst.group < len(groups) else {}
    return json.dumps({k: v for k, v in group.items() if k not in _NOT_SETTINGS}, sort_keys=True) + (
        f"@{inst.kind}:{inst.device_id}")


def match(mv: ModelVersion, config: dict[str, Any]) -> tuple[list[Instance], list[Instance]]:
    """Update `mv`'s instances to `config`'s groups: the instances to start and those to stop.
    Kept instances take their new group's index (and keep their names); new ones are numbered
    after every index in use, so no identity repeats."""
    current = [i for i in mv.instances if not i.leaving]
    free: dict[str, list[Instance]] = defaultdict(list)
    for inst in current:
        free[settings(mv.config or {}, inst)].append(inst)
    first = max((i.index for i in mv.instances), default=-1) + 1
    wanted = instances_of(mv.name, mv.version, config, first)
    added = []
    taken = {i.name for i in mv.instances}
    for want in wanted:
        same = free.get(settings(config, want))
        if same:
            same.pop(0).group = want.group
            continue
        want.index = first
        first += 1
        if want.name in taken:          # a removed instance of that name may still finish its work
            want.name = f"{want.name}_{want.index}"
        taken.add(want.name)
        added.append(want)
    removed = [inst for group in free.values() for inst in group]
    for inst in removed:
        inst.leaving = True
    mv.instances.extend(added)
    mv.scheduler.resized(added, removed)
    return added, removed
