"""Executors: run a study's jobs on workers that each hold one loaded model, in this process or on Ray.

A study gives an executor one :class:`WorkerGroup` per model: how a worker loads the model (``load()``, run once in
the worker; its return value is the worker's state), what each worker asks for (:class:`Resources`), and the first
jobs. A job is a picklable ``job(state, bar)`` where ``bar(total, desc)`` makes a progress bar the driver shows.
When a job returns, ``on_result(group, job, result)`` runs in the driver and returns the group's follow-up jobs
(a model's cells once its calibration is done). Jobs write their results themselves (atomically); executors only
decide where a job runs, so a study's results do not depend on the executor.

Executors are a registry: :data:`EXECUTORS` maps a name to a class; ``@register_executor`` adds one.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, TypeVar, overload

from ..errors import InactiveHeadsError

__all__ = [
    "EXECUTORS",
    "Bar",
    "Executor",
    "Job",
    "LocalExecutor",
    "RayExecutor",
    "Resources",
    "WorkerGroup",
    "register_executor",
]


@dataclass(frozen=True)
class Resources:
    """What one worker (one loaded model) asks of the executor: ``workers`` such workers per model, each with
    ``cpus`` CPU cores (also its torch threads), ``gpus`` GPUs and ``memory_gb`` of RAM reserved."""

    workers: int = 1
    cpus: float | None = None
    gpus: float = 0.0
    memory_gb: float | None = None


class Bar(Protocol):
    """``bar(total, desc)``: a tqdm-like bar (``update(n)``, ``close()``) that the driver shows."""

    def __call__(self, total: int, desc: str) -> Any: ...


#: ``job(state, bar)``: one unit of work on a worker holding a loaded model.
Job = Callable[[Any, Bar], Any]


@dataclass
class WorkerGroup:
    """The workers of one model: ``load()`` builds a worker's state, ``jobs`` are the first jobs to run on them."""

    name: str
    load: Callable[[], Any]
    resources: Resources = field(default_factory=Resources)
    jobs: list[Job] = field(default_factory=list)


class Executor(ABC):
    """Runs the jobs of worker groups. Subclasses set ``name`` and implement :meth:`run`; :meth:`run` and
    :meth:`bar` are used inside ``with executor:``, which starts and stops what the executor needs."""

    name: ClassVar[str]

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @abstractmethod
    def run(self, groups: Sequence[WorkerGroup], on_result: Callable[[WorkerGroup, Job, Any], list[Job]]) -> None:
        """Run every job of every group and every follow-up job ``on_result`` returns; raise the first job error."""

    def bar(self, total: int, desc: str, initial: int = 0) -> Any:
        """The driver's bar over all cells (with rate and ETA), ``initial`` of them already done."""
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit="cell", dynamic_ncols=True)


_EXECUTORS: dict[str, type[Executor]] = {}
#: name -> executor class of every registered executor (read-only; add one with :func:`register_executor`).
EXECUTORS: Mapping[str, type[Executor]] = MappingProxyType(_EXECUTORS)

_E = TypeVar("_E", bound=type[Executor])


@overload
def register_executor(cls: _E, *, override: bool = False) -> _E: ...
@overload
def register_executor(*, override: bool = False) -> Callable[[_E], _E]: ...
def register_executor(cls: _E | None = None, *, override: bool = False) -> _E | Callable[[_E], _E]:
    """Class decorator registering an :class:`Executor` subclass under its ``name`` (``@register_executor`` or
    ``@register_executor(override=True)``); a name already registered raises ``ValueError`` unless ``override``."""

    def decorate(cls: _E) -> _E:
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise InactiveHeadsError(f"{cls.__name__} needs a class attribute `name` to be registered")
        if name in _EXECUTORS and not override:
            raise InactiveHeadsError(f"executor {name!r} is already registered; pass override=True to replace it")
        _EXECUTORS[name] = cls
        return cls

    return decorate if cls is None else decorate(cls)


def _local_bar(total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="seq", leave=False, dynamic_ncols=True)


@register_executor
class LocalExecutor(Executor):
    """Everything in this process, one model at a time: needs nothing beyond the package. Resources are ignored."""

    name = "local"

    def run(self, groups: Sequence[WorkerGroup], on_result: Callable[[WorkerGroup, Job, Any], list[Job]]) -> None:
        for group in groups:
            if not group.jobs:
                continue
            state = group.load()
            queue = deque(group.jobs)
            while queue:
                job = queue.popleft()
                queue.extend(on_result(group, job, job(state, _local_bar)))
            del state
            gc.collect()  # free this model before the next one loads


class _ModelWorker:
    """A Ray actor holding one loaded model; it runs the jobs it is given one at a time."""

    def __init__(self, load: Callable[[], Any], threads: int | None):
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.state = load()

    def ready(self) -> int:
        return os.getpid()

    def run(self, job: Job) -> Any:
        return job(self.state, _ray_bar)


def _ray_bar(total: int, desc: str) -> Any:
    # No bar per job on a worker: Ray's log forwarding drew each of them 2-4 times on the driver, and with rates of
    # the forwarding's bursts, not of the work. The driver's bar advances per finished cell.
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=True)


@register_executor
class RayExecutor(Executor):
    """Jobs on Ray actors: one long-lived actor per (model, slot) loads its model once and runs that model's jobs.

    ``address``: a running Ray cluster (``auto``, ``ray://host:10001``, ``host:6379``); None starts a local Ray
    instance (unless this process already joined one) and stops it at the end. ``init`` options go to ``ray.init``
    for a local instance (e.g. ``num_cpus=2``). Each model gets ``resources.workers`` actors, each reserving
    ``cpus``/``gpus``/``memory_gb`` (Ray starts an actor when a node has them free; a worker no node could ever
    hold is refused before anything runs), and a model's actors are released when its last job ends. A dead actor
    (killed process, lost node) is restarted up to ``max_restarts`` times and its job retried; only its job in
    flight is lost.
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, max_restarts: int = 3, **init: Any):
        _check_reachable(address)
        self.address = address
        self.max_restarts = max_restarts
        self.init = init
        self._started = False

    def __enter__(self) -> RayExecutor:
        ray = _import_ray()
        self._started = not ray.is_initialized()
        if self._started:
            context = ray.init(address=self.address, **self.init)
            if getattr(context, "dashboard_url", None):
                print(f"Ray dashboard: http://{context.dashboard_url}", file=sys.stderr)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            _import_ray().shutdown()

    def run(self, groups: Sequence[WorkerGroup], on_result: Callable[[WorkerGroup, Job, Any], list[Job]]) -> None:
        ray = _import_ray()
        _check_fits(ray, [g for g in groups if g.jobs])
        actor_class = ray.remote(_ModelWorker)
        queued = {id(g): deque(g.jobs) for g in groups}
        actors: dict[int, list[Any]] = {id(g): [] for g in groups}
        idle: dict[int, list[Any]] = {id(g): [] for g in groups}
        starting: dict[Any, tuple[WorkerGroup, Any]] = {}  # ready() ref -> (group, actor)
        running: dict[Any, tuple[WorkerGroup, Any, Job]] = {}  # run() ref -> (group, actor, job)
        for g in groups:
            if not g.jobs:
                continue
            r = g.resources
            options: dict[str, Any] = {
                "num_cpus": 1 if r.cpus is None else r.cpus,
                "num_gpus": r.gpus,
                "max_restarts": self.max_restarts,
                "max_task_retries": self.max_restarts,
            }
            if r.memory_gb:
                options["memory"] = int(r.memory_gb * 2**30)
            threads = None if r.cpus is None else max(1, int(r.cpus))
            for _ in range(r.workers):
                actor = actor_class.options(**options).remote(g.load, threads)
                actors[id(g)].append(actor)
                starting[actor.ready.remote()] = (g, actor)
        try:
            while starting or running:
                [ref], _ = ray.wait([*starting, *running], num_returns=1)
                if ref in starting:
                    g, actor = starting.pop(ref)
                    _get(ray, ref, g)  # a model that fails to load fails the study
                    idle[id(g)].append(actor)
                else:
                    g, actor, job = running.pop(ref)
                    queued[id(g)].extend(on_result(g, job, _get(ray, ref, g)))
                    idle[id(g)].append(actor)
                for g in groups:
                    key = id(g)
                    while idle[key] and queued[key]:
                        actor, job = idle[key].pop(), queued[key].popleft()
                        running[actor.run.remote(job)] = (g, actor, job)
                    busy = any(rg is g for rg, _, _ in running.values())
                    if not queued[key] and not busy and actors[key]:
                        # Nothing left for this model: free its slots (and cancel actors still waiting for one).
                        for ready_ref in [r for r, (rg, _) in starting.items() if rg is g]:
                            del starting[ready_ref]
                        for actor in actors[key]:
                            ray.kill(actor)
                        actors[key], idle[key] = [], []
        finally:
            for group_actors in actors.values():
                for actor in group_actors:
                    with contextlib.suppress(Exception):
                        ray.kill(actor)


def _check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """InactiveHeadsError unless the cluster at ``address`` accepts a TCP connection within ``timeout`` seconds.

    Ray retries an unreachable address for ever, printing a warning every half minute; on a SLURM allocation a
    mistyped address would burn the whole allocation. ``auto`` is probed where ``$RAY_ADDRESS`` names the cluster.
    """
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS") or None
    if address is None or address in ("local", "auto"):
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise InactiveHeadsError(f"Ray address {address!r} is not host:port, ray://host:port or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise InactiveHeadsError(
            f"cannot reach a Ray cluster at {address} ({e.strerror or e}); start one there (ray start --head) or "
            "fix --address"
        ) from None


def _get(ray: Any, ref: Any, group: WorkerGroup) -> Any:
    from ray.exceptions import RayActorError, RayTaskError

    try:
        return ray.get(ref)
    except RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, Exception):
            raise cause from e  # the job's own error (a bad data file, ...), as the local executor raises it
        raise
    except RayActorError as e:
        raise RuntimeError(
            f"a worker of model {group.name} died and could not be restarted ({e}); finished cells are kept, "
            "run the same command again to resume"
        ) from None


def _check_fits(ray: Any, groups: Sequence[WorkerGroup]) -> None:
    """Refuse a worker that no node of the cluster can hold: Ray would wait for such a node forever."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    for g in groups:
        r = g.resources
        need = {"CPU": 1 if r.cpus is None else r.cpus, "GPU": r.gpus, "memory": (r.memory_gb or 0) * 2**30}
        need = {k: v for k, v in need.items() if v}
        if any(all(node.get(k, 0) >= v for k, v in need.items()) for node in nodes):
            continue
        most = {k: max((node.get(k, 0) for node in nodes), default=0) for k in need}
        asked = ", ".join(f"{k} {_amount(k, v)}" for k, v in need.items())
        has = ", ".join(f"{k} {_amount(k, v)}" for k, v in most.items())
        raise InactiveHeadsError(
            f"a worker of model {g.name} asks for {asked}, but the largest node of the Ray cluster has {has}; "
            "lower [resources] in the study file, or start larger nodes first"
        )


def _amount(resource: str, value: float) -> str:
    return f"{value / 2**30:.3g} GB" if resource == "memory" else f"{value:g}"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InactiveHeadsError(
            "the ray executor needs Ray: pip install 'inactive-heads[ray]' (or 'ray>=2.50')"
        ) from None
    return ray
