"""Build identities, the message for a job mixing builds, and the patch switches."""

from __future__ import annotations

import pytest

from hpcdp.runtime import hvd_settings
from hpcdp.runtime.build_guard import BuildMismatch, check_gathered, gloo_rendezvous
from hpcdp.runtime.hvd_build import BuildIdentity, RankBuild, _version_tuple, mismatch

ALL = frozenset(hvd_settings.PATCH_SWITCHES)
PATCHED = BuildIdentity("0.28.1", ALL, ALL)
STOCK = BuildIdentity("0.28.1", frozenset(), frozenset())


def test_describe_names_the_build_and_its_switches() -> None:
    assert STOCK.describe() == "horovod 0.28.1 stock"
    off = BuildIdentity("0.28.1", ALL, ALL - {"gloo-pair-allreduce"})
    assert off.describe() == ("horovod 0.28.1 with hpcdp's patches gloo-pair-allreduce (off), "
                              "gloo-yield-when-busy (on), wake-on-enqueue (on)")
    assert BuildIdentity.from_json(off.to_json()) == off


def test_a_malformed_identity_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a build identity"):
        BuildIdentity.from_json({"version": "0.28.1"})


def test_mismatch_names_both_builds_and_every_rank_and_host() -> None:
    assert mismatch([RankBuild(0, "a", PATCHED), RankBuild(1, "b", PATCHED)]) is None
    text = mismatch([RankBuild(0, "n1", PATCHED), RankBuild(1, "n1", PATCHED),
                     RankBuild(2, "n2", STOCK), RankBuild(3, "n3", PATCHED)])
    assert text is not None
    lines = text.splitlines()
    assert lines[1] == f"  {PATCHED.describe()}: ranks 0, 1 on n1; rank 3 on n3"
    assert lines[2] == "  horovod 0.28.1 stock: rank 2 on n2"
    other_version = BuildIdentity("0.28.2", frozenset(), frozenset())
    assert "0.28.2" in mismatch([RankBuild(0, "a", STOCK), RankBuild(1, "a", other_version)])


def test_switches_follow_the_build_and_the_environment() -> None:
    assert hvd_settings.gloo_env({}, ALL) == {"HOROVOD_GLOO_YIELD_WHEN_BUSY": "1",
                                              "HOROVOD_GLOO_PAIR_ALLREDUCE": "1"}
    assert hvd_settings.gloo_env({}, frozenset({"wake-on-enqueue"})) == {}
    exported = {"HOROVOD_GLOO_PAIR_ALLREDUCE": "0"}
    assert hvd_settings.gloo_env(exported, ALL) == {"HOROVOD_GLOO_YIELD_WHEN_BUSY": "1"}
    env = {"HOROVOD_GLOO_PAIR_ALLREDUCE": "1", "HOROVOD_WAKE_ON_ENQUEUE": "yes",
           "HOROVOD_GLOO_YIELD_WHEN_BUSY": "2"}
    assert hvd_settings.active_patches(env, ALL) == {"gloo-pair-allreduce",
                                                      "gloo-yield-when-busy"}
    assert hvd_settings.active_patches(env, frozenset()) == frozenset()  # stock: nothing on


def test_which_channel_the_check_uses() -> None:
    gloo = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4000",
            "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}
    assert gloo_rendezvous(gloo) == ("10.0.0.1", 4000, 1, 2)
    assert gloo_rendezvous({**gloo, "HOROVOD_SIZE": ""}) is None


def test_gathered_builds_are_compared() -> None:
    def world(*builds: BuildIdentity):
        return lambda mine: [{**mine, "rank": i, "build": b.to_json()}
                             for i, b in enumerate(builds)]

    assert len(check_gathered(PATCHED, 0, world(PATCHED, PATCHED))) == 2
    with pytest.raises(BuildMismatch, match="horovod 0.28.1 stock: rank 1 on "):
        check_gathered(PATCHED, 0, world(PATCHED, STOCK))


def test_version_order() -> None:
    assert _version_tuple("0.28.1") == (0, 28, 1)
    assert _version_tuple("0.28.1+local") >= (0, 28, 1)
    assert _version_tuple("0.27.0rc1") < (0, 28, 1)
    assert _version_tuple("1.0") > (0, 28, 1)
