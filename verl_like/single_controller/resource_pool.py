"""`ResourcePool`: Ray placement groups with one bundle per worker process, in a stable rank order."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from verl_like.single_controller.cluster import describe_nodes, format_resources, node_order_key
from verl_like.single_controller.errors import ResourceUnavailableError
from verl_like.utils.device import ray_resource_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BundleSlot:
    """One process's place: a bundle of a placement group, on node `node_rank`, `local_rank`-th there."""

    placement_group: PlacementGroup
    bundle_index: int
    node_rank: int
    local_rank: int


class ResourcePool:
    """An ordered list of bundle slots; rank r of a group on this pool runs in slot r.

    Create one with `ResourcePool.create`; `split` gives disjoint sub-pools (e.g. actor vs critic), `merge`
    joins pools. Several groups may share a pool (each takes a fraction of every bundle), which is how roles
    in different processes are colocated on the same GPUs.
    """

    def __init__(self, slots: list[BundleSlot], device: str, cpus_per_process: float, name: str) -> None:
        if not slots:
            raise ValueError(f"resource pool {name!r} has no slots")
        self.slots = tuple(slots)
        self.device = device
        self.cpus_per_process = cpus_per_process
        self.name = name

    @classmethod
    def create(
        cls,
        process_on_nodes: list[int],
        device: str = "cpu",
        cpus_per_process: float = 1.0,
        name: str = "global_pool",
        ready_timeout_s: float = 120.0,
        gpus_per_process: int = 1,
    ) -> "ResourcePool":
        """Reserves one placement group per node, `process_on_nodes[i]` bundles each (packed on one node).

        A bundle is {CPU: cpus_per_process} plus {GPU: gpus_per_process} when device == "cuda" (a vLLM server with
        TP > 1 is one process on several GPUs). Raises
        ResourceUnavailableError naming what is missing if the cluster cannot place them in ready_timeout_s.
        """
        if not process_on_nodes or any(n <= 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes={process_on_nodes} must be a non-empty list of positive counts")
        ray_resource_name(device)  # validates the device kind
        bundle = {"CPU": cpus_per_process}
        if device == "cuda":
            bundle["GPU"] = float(gpus_per_process)
        groups = [
            placement_group([dict(bundle)] * n, strategy="STRICT_PACK", name=f"{name}_node{i}")
            for i, n in enumerate(process_on_nodes)
        ]
        try:
            ray.get([pg.ready() for pg in groups], timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            message = _placement_failure(name, process_on_nodes, bundle, groups, ready_timeout_s)
            for pg in groups:
                remove_placement_group(pg)
            raise ResourceUnavailableError(message) from None
        order, node_ips = _node_order(groups)
        logger.info(
            "resource pool %r: %s",
            name,
            ", ".join(f"node rank {r} on {node_ips[i]} ({process_on_nodes[i]} bundles)" for r, i in enumerate(order)),
        )
        slots = [
            BundleSlot(groups[i], index, node_rank, index)
            for node_rank, i in enumerate(order)
            for index in range(process_on_nodes[i])
        ]
        return cls(slots, device, cpus_per_process, name)

    @property
    def world_size(self) -> int:
        return len(self.slots)

    def local_world_size(self, slot: BundleSlot) -> int:
        """How many slots of this pool sit on the same node as `slot`."""
        return sum(1 for s in self.slots if s.node_rank == slot.node_rank)

    def split(self, sizes: list[int], names: list[str] | None = None) -> list["ResourcePool"]:
        """Disjoint consecutive sub-pools of the given sizes (they must add up to world_size)."""
        if sum(sizes) != self.world_size or any(s <= 0 for s in sizes):
            raise ValueError(f"split sizes {sizes} must be positive and add up to the pool's {self.world_size}")
        names = names or [f"{self.name}_{i}" for i in range(len(sizes))]
        pools, start = [], 0
        for size, sub_name in zip(sizes, names):
            pools.append(ResourcePool(list(self.slots[start : start + size]), self.device, self.cpus_per_process, sub_name))
            start += size
        return pools

    @classmethod
    def merge(cls, pools: list["ResourcePool"], name: str | None = None) -> "ResourcePool":
        """One pool over the slots of `pools`, in order; they must share device kind and CPUs per process."""
        kinds = {(p.device, p.cpus_per_process) for p in pools}
        if len(kinds) != 1:
            raise ValueError(f"cannot merge pools with different device/cpus_per_process: {sorted(kinds)}")
        slots = [s for p in pools for s in p.slots]
        keys = [(id(s.placement_group), s.bundle_index) for s in slots]
        if len(set(keys)) != len(keys):
            raise ValueError("cannot merge pools that share bundle slots")
        device, cpus = kinds.pop()
        return cls(slots, device, cpus, name or "+".join(p.name for p in pools))

    def remove(self) -> None:
        """Releases the placement groups behind this pool (and every pool split from the same groups)."""
        seen: set[int] = set()
        for slot in self.slots:
            if id(slot.placement_group) not in seen:
                seen.add(id(slot.placement_group))
                remove_placement_group(slot.placement_group)


def _node_order(groups: list[PlacementGroup]) -> tuple[list[int], list[str]]:
    """The groups' indices ordered by the node holding them (IP, then node id), and each group's node IP.

    Ordering by IP keeps rank order across restarts. Groups on one node keep their creation order (stable sort).
    """
    node_ip = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    table = ray.util.placement_group_table()
    node_of = [table[pg.id.hex()]["bundles_to_node_id"].get(0, "") for pg in groups]
    ips = [node_ip.get(node_id, "?") for node_id in node_of]
    order = sorted(range(len(groups)), key=lambda i: node_order_key(ips[i], node_of[i]))
    return order, ips


def _placement_failure(
    name: str, process_on_nodes: list[int], bundle: dict[str, float], groups: list[PlacementGroup], timeout_s: float
) -> str:
    """Says what the pool needs, how much of it was placed, and what each node of the cluster has."""
    table = ray.util.placement_group_table()
    placed = sum(1 for pg in groups if table.get(pg.id.hex(), {}).get("state") == "CREATED")
    per_node = sorted({format_resources({k: v * n for k, v in bundle.items()}) for n in process_on_nodes})
    return (
        f"resource pool {name!r} needs {len(process_on_nodes)} node(s) with {process_on_nodes} bundles of {bundle} "
        f"each (a node group needs {' or '.join(per_node)} on one node), but only {placed} of {len(groups)} node "
        f"groups could be placed within {timeout_s:g} s. Cluster total: {format_resources(ray.cluster_resources())}; "
        f"available now: {format_resources(ray.available_resources())}; {describe_nodes()}. Lower trainer.nnodes / "
        "trainer.n_gpus_per_node / trainer.cpus_per_worker, add nodes, or raise "
        "trainer.timeouts.worker_start_timeout_s if nodes are still joining."
    )
