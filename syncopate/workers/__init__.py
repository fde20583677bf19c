"""Ray GPU workers: gangs of long-lived actors (one per GPU, one process group) that measure
baselines and candidates through a pluggable runner.

Importing this package does not import ray or torch; gangs import ray when they start.
"""

from syncopate.workers.env import ACTOR_ENV, MULTICAST_OFF, actor_runtime_env, child_env
from syncopate.workers.gang import Gang, PlacementPlan
from syncopate.workers.outcomes import (
    BaselineOutcome,
    CandidateOutcome,
    DeviceInfo,
    classify_exception,
    slowest,
    summarize,
)
from syncopate.workers.runner import (
    AVAILABLE_RUNNERS,
    IN_PROCESS_RUNNERS,
    Runner,
    RunnerSpec,
    make_runner,
    runner_class,
)
from syncopate.workers.tasks import GangTask, TaskBoard, failure_text

__all__ = [
    "ACTOR_ENV",
    "AVAILABLE_RUNNERS",
    "IN_PROCESS_RUNNERS",
    "MULTICAST_OFF",
    "BaselineOutcome",
    "CandidateOutcome",
    "DeviceInfo",
    "Gang",
    "GangTask",
    "PlacementPlan",
    "Runner",
    "RunnerSpec",
    "TaskBoard",
    "actor_runtime_env",
    "child_env",
    "classify_exception",
    "failure_text",
    "make_runner",
    "runner_class",
    "slowest",
    "summarize",
]
