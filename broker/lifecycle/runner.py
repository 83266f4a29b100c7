"""Model operations (the startup load, explicit loads and unloads, poll-mode changes) run as
coroutines that the broker's loop drives, so a load never blocks the loop.

An operation is a generator that yields what it waits for:
  Job(fn)       fn() runs on the job pool (reading configs, scanning, mirroring); the generator
                resumes with its result, or the exception is raised inside it
  Until(pred)   resumes once pred() holds (looked at every loop turn: workers came up)
  Lock(names)   resumes once it holds these model names. Operations on the same or related
                models run one at a time, in arrival order, as Triton serialises them; when too
                many already wait for one of them, the request gets Triton's conflict error
  Slot()        resumes once fewer than --model-load-thread-count models are loading; held
                until the operation ends or yields FreeSlot()
  All(gens)     runs sub-operations side by side (they share the parent's locks); resumes
                with a list of their results (or the TritonErrors they ended with)
Its return value, or the TritonError it raises, answers whoever asked.
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tritond.wire.errors import Code, TritonError

from tritond.broker.lifecycle.jobs import Jobs

log = logging.getLogger("tritond.broker")

MAX_WAITING = 64       # operations that may wait for the same model before the next is refused

Answer = Callable[..., None]     # answer(result) or answer(error=TritonError)


@dataclass
class Job:
    fn: Callable[[], Any]


@dataclass
class Until:
    pred: Callable[[], bool]


@dataclass
class Lock:
    names: frozenset[str]


class Slot:
    pass


class FreeSlot:
    pass


@dataclass
class All:
    gens: list[Generator]


def conflict(name: str) -> TritonError:
    return TritonError(Code.INTERNAL, f"a related model '{name}' to a load/unload request is currently "
                                      f"loading or unloading")


@dataclass(eq=False)
class Task:
    seq: int
    gen: Generator
    answer: Answer | None
    parent: "Task | None" = None
    index: int = 0
    wait: Any = None
    locks: frozenset[str] = frozenset()
    slot: bool = False
    results: list[Any] = field(default_factory=list)
    pending: int = 0
    done: bool = False

    def holds(self) -> frozenset[str]:
        """The names this task holds, directly or through its ancestors."""
        t: Task | None = self
        while t is not None:
            if t.locks:
                return t.locks
            t = t.parent
        return frozenset()


class OpRunner:
    def __init__(self, jobs: Jobs, slots: int, max_waiting: int = MAX_WAITING) -> None:
        self.jobs = jobs
        self.slots = max(1, slots)
        self.max_waiting = max_waiting
        self.used = 0
        self.seqs = itertools.count(1)
        self.tasks: list[Task] = []            # live tasks
        self.waiting: list[Task] = []          # tasks waiting on Until, Lock or Slot

    # ---------------------------------------------------------------- starting and finishing

    def start(self, gen: Generator, answer: Answer | None = None) -> Task:
        task = Task(next(self.seqs), gen, answer)
        self.tasks.append(task)
        self._step(task)
        return task

    def idle(self) -> bool:
        return not self.tasks

    def locked(self) -> set[str]:
        """Model names held or waited for by some operation."""
        out: set[str] = set()
        for t in self.tasks:
            out |= t.locks
            if isinstance(t.wait, Lock):
                out |= t.wait.names
        return out

    def _finish(self, task: Task, result: Any = None, error: TritonError | None = None) -> None:
        task.done = True
        self.tasks.remove(task)
        if task in self.waiting:
            self.waiting.remove(task)
        task.locks = frozenset()
        if task.slot:
            task.slot = False
            self.used -= 1
        if task.parent is not None:
            parent = task.parent
            parent.results[task.index] = error if error is not None else result
            parent.pending -= 1
            if parent.pending == 0 and not parent.done:
                self._step(parent, parent.results)
        elif task.answer is not None:
            if error is not None:
                task.answer(error=error)
            else:
                task.answer(result)
        self.tick()

    # ---------------------------------------------------------------- stepping

    def _step(self, task: Task, value: Any = None, exc: BaseException | None = None) -> None:
        while True:
            try:
                wait = task.gen.throw(exc) if exc is not None else task.gen.send(value)
            except StopIteration as stop:
                self._finish(task, stop.value)
                return
            except TritonError as e:
                self._finish(task, error=e)
                return
            except Exception as e:
                log.exception("a model operation failed")
                self._finish(task, error=TritonError(Code.INTERNAL, f"model operation failed: {e}"))
                return
            value, exc = None, None
            if isinstance(wait, Job):
                task.wait = wait
                self.jobs.submit(wait.fn, lambda f, t=task: self._job_done(t, f))
                return
            if isinstance(wait, All):
                if not wait.gens:
                    value = []
                    continue
                task.wait = wait
                task.results = [None] * len(wait.gens)
                task.pending = len(wait.gens)
                for i, g in enumerate(wait.gens):
                    child = Task(next(self.seqs), g, None, task, i)
                    self.tasks.append(child)
                    self._step(child)
                return
            if isinstance(wait, FreeSlot):
                if task.slot:
                    task.slot = False
                    self.used -= 1
                    self.tick()
                continue
            if isinstance(wait, Lock):
                refused = self._refuse(task, wait.names)
                if refused:
                    exc = conflict(refused)
                    continue
            if self._ready(task, wait):
                continue
            task.wait = wait
            self.waiting.append(task)
            return

    def _job_done(self, task: Task, fut: Future) -> None:
        if task.done:
            return
        task.wait = None
        try:
            result = fut.result()
        except Exception as e:
            self._step(task, exc=e)
            return
        self._step(task, result)

    def _ready(self, task: Task, wait: Any) -> bool:
        """Take what `wait` asks for if it is available now."""
        if isinstance(wait, Until):
            return bool(wait.pred())
        if isinstance(wait, Slot):
            if task.slot:
                return True
            if self.used < self.slots:
                self.used += 1
                task.slot = True
                return True
            return False
        if isinstance(wait, Lock):
            if self._blocked(task, wait.names):
                return False
            task.locks = task.locks | wait.names
            return True
        raise TypeError(f"a model operation yielded {wait!r}")

    def _blocked(self, task: Task, names: frozenset[str]) -> bool:
        mine = task.holds()
        for other in self.tasks:
            if other is task or other.locks is mine:
                continue
            if other.locks & names:
                return True
            if isinstance(other.wait, Lock) and other.seq < task.seq and other.wait.names & names:
                return True
        return False

    def _refuse(self, task: Task, names: frozenset[str]) -> str:
        """The model to name in a conflict error when too many operations wait already ('' if not)."""
        waiting = [t for t in self.waiting if isinstance(t.wait, Lock) and t.wait.names & names]
        if len(waiting) < self.max_waiting:
            return ""
        held = sorted(n for t in self.tasks for n in t.locks & names)
        return held[0] if held else sorted(names)[0]

    def tick(self) -> None:
        """Resume tasks whose wait is over, oldest first."""
        progressed = bool(self.waiting)
        while progressed:
            progressed = False
            for task in sorted(self.waiting, key=lambda t: t.seq):
                if task.done or task not in self.waiting:
                    continue
                if self._ready(task, task.wait):
                    self.waiting.remove(task)
                    task.wait = None
                    self._step(task)
                    progressed = True
                    break


def names(*groups: Iterable[str]) -> frozenset[str]:
    return frozenset(n for g in groups for n in g)
