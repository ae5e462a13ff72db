"""`hpcdp doctor`'s report of the threads and yielding training will set (pure)."""

from __future__ import annotations

from hpcdp.doctor import FAIL, OK, WARN, RuntimeReport, my_runtime, runtime_checks


def test_one_line_per_node_and_setting() -> None:
    same = "threads 1 (2 CPUs / 2 local ranks), yield on (4 busy threads > 2 CPUs)"
    reports = [RuntimeReport(r, "n1", same, False) for r in (0, 1)]
    reports += [RuntimeReport(2, "n2", "threads 4 (OMP_NUM_THREADS exported), yield off (x); "
                              "oversubscribed: 2 rank(s) x 4 thread(s) > 2 CPUs", True),
                RuntimeReport(3, "n2", "", False, "OMP_NUM_THREADS='x' is not a positive number")]
    checks = runtime_checks(reports)
    assert [(c.status, c.detail.split(":")[0]) for c in checks] == [
        (OK, "n1, ranks 0-1"), (WARN, "n2, rank 2"), (FAIL, "n2, rank 3")]
    assert checks[0].detail == f"n1, ranks 0-1: training sets {same}"
    assert "unset OMP_NUM_THREADS or lower it" in checks[1].detail


def test_my_runtime_warns_when_exports_oversubscribe() -> None:
    env = {"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMP_NUM_THREADS": "100000"}
    rep = my_runtime(0, "h", env)
    assert rep.oversubscribed and "oversubscribed: 2 rank(s) x 100000 thread(s)" in rep.summary
    fine = my_runtime(0, "h", {})
    assert not fine.oversubscribed and fine.summary.startswith("threads ")
    assert my_runtime(0, "h", {"OMP_NUM_THREADS": "none"}).error


def test_wake_patch_is_reported() -> None:
    from hpcdp.doctor import OK, WARN, wake_check

    assert wake_check(True).status == OK
    plain = wake_check(False)
    assert plain.status == WARN and "make setup" in plain.detail


def test_gloo_patches_are_reported() -> None:
    from hpcdp.doctor import OK, WARN, gloo_check

    assert gloo_check(frozenset({"gloo-yield-when-busy", "gloo-pair-allreduce"})).status == OK
    half = gloo_check(frozenset({"wake-on-enqueue", "gloo-pair-allreduce"}))
    assert half.status == WARN and "gloo-yield-when-busy patch" in half.detail
    assert "make setup" in gloo_check(frozenset()).detail


def test_the_build_in_use_is_named() -> None:
    from hpcdp.doctor import OK, build_check
    from hpcdp.runtime.hvd_build import BuildIdentity

    everything = frozenset({"wake-on-enqueue", "gloo-yield-when-busy", "gloo-pair-allreduce"})
    patched = build_check(BuildIdentity("0.28.1", everything, frozenset()))
    assert patched.status == OK and "hpcdp's patched build" in patched.detail
    stock = build_check(BuildIdentity("0.28.1", frozenset(), frozenset()))
    assert stock.detail.startswith("horovod 0.28.1 stock: stock Horovod")
    assert "partly" in build_check(BuildIdentity("0.28.1", frozenset({"wake-on-enqueue"}),
                                                 frozenset())).detail


def test_root_under_open_mpi_gets_the_two_exports() -> None:
    from hpcdp.doctor import ROOT_EXPORTS, root_check

    ompi = "Open MPI v4.1.4, package: Debian OpenMPI"
    warned = root_check(0, ompi, {"OMPI_ALLOW_RUN_AS_ROOT": "1"})
    assert warned is not None and warned.status == WARN
    assert f"`{ROOT_EXPORTS}`" in warned.detail
    assert ROOT_EXPORTS == "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    both = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    assert root_check(0, ompi, both).status == OK
    assert root_check(1000, ompi, {}) is None  # not root: nothing to say
    assert root_check(0, "MPICH Version: 4.0", {}) is None  # only Open MPI refuses root
