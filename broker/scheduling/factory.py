"""Which scheduling a model version gets once it is READY: the only place that knows the kinds."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tritond.broker.scheduling.policy import Batches, Scheduling
from tritond.broker.scheduling.queued import QueuedScheduling
from tritond.broker.scheduling.sequence import SequenceScheduling

if TYPE_CHECKING:
    from tritond.broker.tables.model_version import ModelVersion


def new_scheduling(mv: "ModelVersion", path: Batches) -> Scheduling:
    """The sequence batcher for a model with `sequence_batching`, else the default or dynamic
    batcher."""
    if mv.view.sequence is not None:
        return SequenceScheduling(mv, path)
    return QueuedScheduling(mv, path)
