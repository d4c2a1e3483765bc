"""Membership rules (docs/contracts.md §3)."""

from __future__ import annotations

from cohort.operator.world import Member, World, next_world, world_size


def members(*names: str) -> list[Member]:
    return [Member(n, f"uid-{n}", f"10.0.0.{i}") for i, n in enumerate(names)]


def w(version: int, *names: str) -> World:
    return World(version=version, members=tuple(members(*names)))


def test_first_world_needs_min_and_is_capped_at_target():
    prev = World()
    # Below min there is no world; Ready pods are listed as spares (they wait, and are not deleted).
    alone = next_world(prev, members("j-worker-0"), target=4, unit=1, minimum=2)
    assert alone.version == 0 and alone.members == () and [s.pod for s in alone.spares] == ["j-worker-0"]
    nw = next_world(prev, members("j-worker-0", "j-worker-1", "j-worker-2"), target=2, unit=1, minimum=2)
    assert nw.version == 1 and nw.names == ["j-worker-0", "j-worker-1"]
    assert [s.pod for s in nw.spares] == ["j-worker-2"]
    assert "formed" in nw.reason


def test_survivors_keep_order_and_newcomers_are_appended_oldest_first():
    prev = w(3, "j-worker-5", "j-worker-1", "j-worker-2")
    ready = members("j-worker-1", "j-worker-5", "j-worker-9", "j-worker-7")
    nw = next_world(prev, ready, target=4, unit=1, minimum=2, why={"j-worker-2": "failed"})
    assert nw.names == ["j-worker-5", "j-worker-1", "j-worker-7", "j-worker-9"]
    assert nw.version == 4
    assert "worker j-worker-2 failed" in nw.reason and "j-worker-7, j-worker-9 joined" in nw.reason


def test_version_only_grows_on_member_changes():
    prev = w(3, "j-worker-0", "j-worker-1")
    same = next_world(prev, members("j-worker-0", "j-worker-1", "j-worker-2"), target=2, unit=1, minimum=1)
    assert same.version == 3 and [s.pod for s in same.spares] == ["j-worker-2"]


def test_scale_down_drops_the_newest_members():
    prev = w(1, "j-worker-0", "j-worker-3", "j-worker-1", "j-worker-2")
    nw = next_world(prev, members("j-worker-0", "j-worker-1", "j-worker-2", "j-worker-3"), target=2, unit=1,
                    minimum=1)
    assert nw.names == ["j-worker-0", "j-worker-1"]


def test_size_is_a_multiple_of_the_model_parallel_unit():
    assert world_size(7, target=8, unit=2, minimum=2) == 6
    assert world_size(3, target=8, unit=4, minimum=4) == 0
    prev = w(1, "j-worker-0", "j-worker-1", "j-worker-2", "j-worker-3")
    nw = next_world(prev, members("j-worker-0", "j-worker-1", "j-worker-3"), target=4, unit=2, minimum=2)
    assert nw.names == ["j-worker-0", "j-worker-1"] and [s.pod for s in nw.spares] == ["j-worker-3"]


def test_below_min_publishes_an_empty_world():
    prev = w(2, "j-worker-0", "j-worker-1")
    nw = next_world(prev, members("j-worker-0"), target=2, unit=1, minimum=2, why={"j-worker-1": "was deleted"})
    assert nw.version == 3 and nw.members == () and [s.pod for s in nw.spares] == ["j-worker-0"]
    assert "waiting" in nw.reason


def test_world_json_round_trip():
    world = World(version=5, members=tuple(members("a", "b")), spares=tuple(members("c")), reason="x")
    assert World.parse(world.render()) == world
    assert World.parse("not json") is None and World.parse(None) is None
    assert world.to_json()["master"]["addr"] == world.members[0].ip
    assert World().to_json()["master"] is None
