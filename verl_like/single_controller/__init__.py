"""The single-controller runtime: resource pools, worker groups and the dispatch of group calls."""

from verl_like.single_controller.cluster import init_ray
from verl_like.single_controller.dispatch import Dispatch, Execute, register
from verl_like.single_controller.errors import (
    ResourceUnavailableError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupError,
    WorkerTimeoutError,
)
from verl_like.single_controller.host import RoleSpec
from verl_like.single_controller.resource_pool import ResourcePool
from verl_like.single_controller.worker import Worker
from verl_like.single_controller.worker_group import GroupFuture, WorkerGroup, shutdown_all_groups

__all__ = [
    "Dispatch",
    "Execute",
    "GroupFuture",
    "ResourcePool",
    "ResourceUnavailableError",
    "RoleSpec",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerTimeoutError",
    "init_ray",
    "register",
    "shutdown_all_groups",
]
