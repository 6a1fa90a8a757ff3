"""Agents as rollout workflows, chosen by name in the rollout config.

A workflow plays one trajectory of a requested group: given the engine, the tools, the step sink,
the request and the trajectory's index in the group, it returns the finished trajectory, or None
when it has nothing to deliver. The rollout service knows nothing else about agents, so the
ASearcher agent, an evaluation or synthesis agent and a user's own agent all plug in the same
way:

    from asearcher.producers.agents.workflows import register

    @register("mine")
    class MyWorkflow:
        def __init__(self, config: AgentConfig) -> None: ...
        async def run(self, engine, tools, steps, request, index) -> TrajectoryFinished | None: ...

A name is either registered here (`names()`) or `package.module:attr`, imported when the config
is loaded, as tool backends are. Either way it names a factory: called with the rollout config's
`AgentConfig`, it returns the workflow (a class is such a factory).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol, TypeVar

from asearcher.producers.agents.agent import AgentConfig, AsearcherWorkflow, StepSink, ToolClient
from asearcher.producers.agents.reasoning_agent import ReasoningWorkflow
from asearcher.producers.agents.timed_workflow import TimedWorkflow
from asearcher.producers.engines.base import InferenceEngine
from asearcher.streams.wire.events import RolloutRequested, TrajectoryFinished

DEFAULT = "asearcher"


class Workflow(Protocol):
    """Plays one trajectory of a group."""

    async def run(
        self,
        engine: InferenceEngine,
        tools: ToolClient,
        steps: StepSink,
        request: RolloutRequested,
        index: int,
    ) -> TrajectoryFinished | None:
        """Trajectory `index` of `request`'s group, finished and scored; None: nothing to deliver.

        Emit each LLM call on `steps` as it happens; call tools through `tools`.
        """
        ...


WorkflowFactory = Callable[[AgentConfig], Workflow]
F = TypeVar("F", bound=WorkflowFactory)

_REGISTRY: dict[str, WorkflowFactory] = {}


def register(name: str, factory: F | None = None) -> Callable[[F], F] | F:
    """Register `factory` under `name`; without `factory`, a decorator that does.

    Registering a name again replaces the earlier factory (a reloaded module stays usable).
    """
    if not name or ":" in name:
        raise ValueError(f"a workflow name must be non-empty and without ':', got {name!r}")

    def add(made: F) -> F:
        _REGISTRY[name] = made
        return made

    return add if factory is None else add(factory)


def names() -> list[str]:
    """The registered workflow names, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> WorkflowFactory:
    """The factory `name` names (registered, or `package.module:attr`); a one-line ValueError
    naming the field `workflow` and the known names otherwise."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(names())
        raise ValueError(f"workflow must be one of {known} or package.module:attr, got {name!r}")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"workflow {name!r} cannot be loaded: {exc}") from exc
    if not callable(factory):
        raise ValueError(f"workflow {name!r} is not a factory taking an AgentConfig")
    return factory


def build(name: str, config: AgentConfig) -> Workflow:
    """The workflow `name` names, made for `config`."""
    workflow = get(name)(config)
    if not callable(getattr(workflow, "run", None)):
        raise ValueError(f"workflow {name!r} made {type(workflow).__name__}, which has no run()")
    return workflow


register(DEFAULT, AsearcherWorkflow)
register("asearcher-reasoning", ReasoningWorkflow)  # the reasoning web agent (evaluation)
register("timed", TimedWorkflow)  # a stand-in that waits as an engine and tools would
