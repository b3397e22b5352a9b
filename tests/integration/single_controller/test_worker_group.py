"""The single-controller runtime on a real local Ray cluster: dispatch, colocation, pools, faults."""

from __future__ import annotations

import ipaddress
import time

import pytest
import ray
import torch

from verl_like.protocol import DataProto
from verl_like.single_controller import (
    ResourcePool,
    ResourceUnavailableError,
    RoleSpec,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    WorkerTimeoutError,
)
from verl_like.single_controller.timeouts import CallTimeouts

import workers_for_tests
from workers_for_tests import ConsumerWorker, EchoWorker, MeshWorker

# The Ray workers cannot import test modules; ship the worker classes by value.
ray.cloudpickle.register_pickle_by_value(workers_for_tests)


def _proto(n: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(n, dtype=torch.int64)},
        non_tensors={"name": [f"row{i}" for i in range(n)]},
    )


@pytest.fixture(scope="module")
def pool(ray_cluster):
    p = ResourcePool.create([2], device="cpu", cpus_per_process=0.5, name="sc_test")
    yield p
    p.remove()


@pytest.fixture(scope="module")
def echo(pool):
    # Groups sharing a pool take fractions of its bundles that add up to at most 1.
    group = WorkerGroup(pool, RoleSpec(EchoWorker), name="echo", resource_fraction=0.5)
    yield group
    group.shutdown()


def test_workers_get_rank_env_and_one_rendezvous(echo):
    infos = echo.whoami()
    assert [i["rank"] for i in infos] == [0, 1]
    assert {i["world_size"] for i in infos} == {2}
    assert [i["local_rank"] for i in infos] == [0, 1]
    assert len({i["master"] for i in infos}) == 1
    assert len({i["pid"] for i in infos}) == 2


def test_all_to_all_gives_each_rank_its_entry(echo):
    assert echo.scale([10, 20], factor=[1, 3]) == [10, 61]
    with pytest.raises(ValueError, match="one entry per worker"):
        echo.scale([1, 2, 3])


def test_dp_compute_proto_pads_chunks_and_unpads(echo):
    out = echo.double(_proto(5))
    assert out.batch["y"].tolist() == [0, 2, 4, 6, 8]
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert list(out.non_tensor_batch["name"]) == [f"row{i}" for i in range(5)]


def test_rank_zero_execution_returns_one_value(echo):
    assert echo.only_rank_zero(7) == (0, 7)


def test_unregistered_method_is_refused_with_the_registered_list(echo):
    with pytest.raises(AttributeError, match="not a @register-ed method.*whoami"):
        echo.not_registered()


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def test_gloo_all_reduce_inside_group_listens_on_loopback_only(echo):
    assert echo.all_reduce_rank() == [3.0, 3.0]
    # On a local cluster (MASTER_ADDR 127.0.0.1) the rendezvous store and gloo bind loopback, not every interface.
    for rank, addresses in enumerate(echo.listening_addresses()):
        exposed = [(ip, port) for ip, port in addresses if not _is_loopback(ip)]
        assert addresses and not exposed, f"rank {rank} listens beyond loopback: {exposed}"


def test_nonblocking_future_chains_to_another_group_without_driver(pool, echo):
    consumer = WorkerGroup(pool, RoleSpec(ConsumerWorker), name="consumer", resource_fraction=0.25)
    try:
        future = echo.double_async(_proto(6))
        out = consumer.add_one(future)
        assert out.batch["z"].tolist() == [1, 3, 5, 7, 9, 11]
        assert out.batch["consumer_rank"].tolist() == [0, 0, 0, 1, 1, 1]
        assert future.result().batch["y"].tolist() == [0, 2, 4, 6, 8, 10]
        # A chained batch that does not divide over the consumer's ranks is refused, naming the sizes.
        with pytest.raises(WorkerError, match="5 rows cannot be split evenly over 2"):
            consumer.add_one(echo.double_async(_proto(5)))
    finally:
        consumer.shutdown()


def test_colocated_roles_share_one_process_and_its_state(pool):
    group = WorkerGroup(
        pool,
        {"actor": RoleSpec(EchoWorker, kwargs={"tag": "actor"}), "ref": RoleSpec(EchoWorker, kwargs={"tag": "ref"})},
        name="colocated",
        resource_fraction=0.25,
    )
    try:
        actor_info = group.role("actor").whoami()
        ref_info = group.role("ref").whoami()
        assert [i["pid"] for i in actor_info] == [i["pid"] for i in ref_info]
        assert {i["tag"] for i in actor_info} == {"actor"} and {i["tag"] for i in ref_info} == {"ref"}
        # One process: a module-level effect of one role is visible to the other; role state stays separate.
        group.role("actor").set_state("k", 1)
        assert group.role("ref").get_state("k") == [None, None]
        assert group.role("actor").call(EchoWorker.get_state, "k") == [1, 1]
        with pytest.raises(AttributeError, match="colocates roles"):
            group.whoami()
    finally:
        group.shutdown()


def test_mesh_dispatch_sends_one_chunk_per_dp_group_and_collects_once(ray_cluster):
    pool4 = ResourcePool.create([4], device="cpu", cpus_per_process=0.25, name="mesh_pool")
    group = WorkerGroup(pool4, RoleSpec(MeshWorker), name="mesh")
    try:
        out = group.generate(_proto(4))
        assert out.batch["x"].tolist() == [0, 1, 2, 3]
        assert out.batch["by"].tolist() == [0, 0, 2, 2]  # collected from the even (collecting) ranks
        assert group.seen_rows() == [[[0, 1]], [[0, 1]], [[2, 3]], [[2, 3]]]
        with pytest.raises(ValueError, match="never called register_mesh\\('undeclared'"):
            group.bad_mesh(_proto(4))
    finally:
        group.shutdown()
        pool4.remove()


def test_split_pools_place_roles_on_disjoint_bundles(ray_cluster):
    pool3 = ResourcePool.create([3], device="cpu", cpus_per_process=0.25, name="split_pool")
    actor_pool, critic_pool = pool3.split([2, 1], names=["actor_pool", "critic_pool"])
    assert (actor_pool.world_size, critic_pool.world_size) == (2, 1)
    assert [s.bundle_index for s in actor_pool.slots] == [0, 1]
    assert [s.bundle_index for s in critic_pool.slots] == [2]
    merged = ResourcePool.merge([actor_pool, critic_pool])
    assert [s.bundle_index for s in merged.slots] == [0, 1, 2]
    with pytest.raises(ValueError, match="share bundle slots"):
        ResourcePool.merge([actor_pool, actor_pool])
    with pytest.raises(ValueError, match="add up"):
        pool3.split([2, 2])
    actors = WorkerGroup(actor_pool, RoleSpec(EchoWorker), name="split_actor")
    critic = WorkerGroup(critic_pool, RoleSpec(EchoWorker), name="split_critic")
    try:
        assert [i["world_size"] for i in actors.whoami()] == [2, 2]
        assert [i["world_size"] for i in critic.whoami()] == [1]
        assert critic.all_reduce_rank() == [1.0]
    finally:
        actors.shutdown()
        critic.shutdown()
        pool3.remove()


def test_worker_exception_names_group_method_rank_and_traceback(echo):
    with pytest.raises(WorkerError) as info:
        echo.fail_on(1)
    err = info.value
    assert err.rank == 1 and "echo.echo.fail_on" in str(err)
    assert "deliberate failure on rank 1" in err.remote_traceback
    assert "ValueError" in err.remote_traceback
    assert echo.whoami()[0]["rank"] == 0  # the group still works afterwards


def test_timeout_names_the_slow_rank_instead_of_hanging(echo):
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=r"ranks \[0\] did not finish within 1 s"):
        echo.sleep_on(0, 5.0, timeout_s=1.0)
    assert time.monotonic() - start < 4.0
    time.sleep(4.5)  # let rank 0 finish its sleep before the next test uses the group


def test_adaptive_default_timeout_stops_a_stalled_call_after_a_multiple_of_the_earlier_ones(pool):
    group = WorkerGroup(pool, RoleSpec(EchoWorker), name="stall", resource_fraction=0.25,
                        default_timeout_s=CallTimeouts(first_call_s=60, factor=3, min_s=1.5))
    try:
        group.sleep_on(1, 0.2)  # the first call sets the method's pace
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError, match=r"stall.stall.sleep_on: ranks \[1\] did not finish within 1.5 s"
                           r".*slowest earlier call"):
            group.sleep_on(1, 6.0)  # an injected stall
        assert time.monotonic() - start < 4.0
    finally:
        group.shutdown()


def test_dead_actor_raises_and_shutdown_leaves_no_actors(pool):
    group = WorkerGroup(pool, RoleSpec(EchoWorker), name="dying", resource_fraction=0.25)
    try:
        with pytest.raises(WorkerDiedError, match="rank 1 died"):
            group.die_on(1)
    finally:
        group.shutdown()
    alive = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("dying_")]
    assert alive == []


def test_pool_that_cannot_be_placed_fails_fast_naming_what_is_missing(ray_cluster):
    start = time.monotonic()
    with pytest.raises(ResourceUnavailableError, match="needs 1 node.*\\[64\\] bundles.*Cluster total"):
        ResourcePool.create([64], device="cpu", cpus_per_process=1.0, name="too_big", ready_timeout_s=2.0)
    assert time.monotonic() - start < 30
