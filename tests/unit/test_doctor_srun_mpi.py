"""`hpcdp doctor`'s advice on srun's MPI plugin, from canned `srun --mpi=list` output."""

from __future__ import annotations

import pytest

from hpcdp.doctor import FAIL, OK, WARN, mpi_plugin_check, srun_plugins

# As Slurm 22.05 prints it.
LISTING = ("MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\n"
           "specific pmix plugin versions available: pmix_v4\n")
OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4"
INTEL = "Intel(R) MPI Library 2021.10 for Linux* OS"
CRAY = "MPI VERSION    : CRAY MPICH version 8.1.27.26 (ANL base 3.4a2)"


def test_plugins_are_read_from_the_listing() -> None:
    assert srun_plugins(LISTING) == ["pmix", "none", "cray_shasta", "pmi2", "pmix_v4"]
    assert srun_plugins("") == []


@pytest.mark.parametrize(
    ("library", "default", "chosen", "status", "needle"),
    [
        (OPEN_MPI, "pmix", None, OK, "the site's MpiDefault=pmix fits Open MPI v4.1.4"),
        (OPEN_MPI, "none", None, FAIL, "export HPCDP_SRUN_MPI=pmix"),
        (OPEN_MPI, "none", "pmix_v4", OK, "HPCDP_SRUN_MPI=pmix_v4 fits"),
        (CRAY, "cray_shasta", None, OK, "fits"),
        (CRAY, "pmix", None, FAIL, "export HPCDP_SRUN_MPI=cray_shasta"),
        (INTEL, "pmix", None, OK, "fits"),
        (INTEL, "none", None, FAIL, "export HPCDP_SRUN_MPI=pmi2"),
        ("Some MPI 1.0", "pmix", None, WARN, "unknown MPI library"),
    ],
)
def test_the_plugin_that_fits_the_library(library: str, default: str, chosen: str | None,
                                          status: str, needle: str) -> None:
    check = mpi_plugin_check(library, srun_plugins(LISTING), default, chosen)
    assert check.status == status and needle in check.detail, check


def test_no_fitting_plugin_is_a_failure() -> None:
    check = mpi_plugin_check(CRAY, ["pmix", "none"], "pmix", None)
    assert check.status == FAIL and "none of cray_shasta" in check.detail
