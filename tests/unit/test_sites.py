"""Site profiles: the examples' renderings (golden), validation, merge rules, the choice.

Regenerate the site goldens with `HPCDP_UPDATE_GOLDEN=1 python -m pytest
tests/unit/test_sites.py` when a change to an example or the renderer is intended.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_slurm_render import GOLDEN, check_golden

from hpcdp.cluster import cli, sites
from hpcdp.cluster.render import render

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "slurm" / "sites"


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def refused(text: str, tmp_path: Path) -> str:
    path = write(tmp_path, "mysite", text)
    with pytest.raises(sites.SiteError) as err:
        sites.load(path)
    assert str(path) in str(err.value)  # every message names the file
    return str(err.value)


def no_env(tmp_path: Path) -> dict[str, str]:
    """An environment with no user profiles and no cluster."""
    return {"HOME": str(tmp_path / "home")}


@pytest.mark.parametrize("name", ["infiniband", "cray-ex", "workstation", "ethernet"])
def test_example_renders_as_its_golden(name: str) -> None:
    options = sites.to_options(sites.load(EXAMPLES / f"{name}.toml"))
    check_golden(GOLDEN / f"site_{name}.sbatch", render(**options))


def test_the_examples_are_the_four_and_each_is_bash(tmp_path: Path) -> None:
    assert sorted(sites.known_sites(no_env(tmp_path))) == ["cray-ex", "ethernet",
                                                          "infiniband", "workstation"]
    for path in EXAMPLES.glob("*.toml"):
        script = tmp_path / f"{path.stem}.sbatch"
        script.write_text(render(**sites.to_options(sites.load(path))))
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_slingshot_example_sets_libfabric_for_cxi() -> None:
    text = render(**sites.to_options(sites.load(EXAMPLES / "cray-ex.toml")))
    for line in ("export FI_PROVIDER=cxi", "export FI_CXI_DISABLE_HOST_REGISTER=1",
                 "export NCCL_SOCKET_IFNAME=hsn", "export HPCDP_SRUN_MPI=cray_shasta",
                 "srun_options=(--cpu-bind=cores)", "module load cray-mpich"):
        assert line in text.splitlines(), line


def test_profile_keys_become_render_options(tmp_path: Path) -> None:
    path = write(tmp_path, "s", """
modules = ["a/1", "b/2"]
setup = ["ulimit -n 4096"]
venv = "/v"
[sbatch]
partition = "p"
account = "acc"
qos = "q"
constraint = "c"
options = ["--mem=0"]
[srun]
mpi = "pmi2"
cpu_bind = "cores"
gpu_bind = "single:1"
options = ["--distribution=block"]
[env]
NCCL_IB_HCA = "mlx5_0"
NCCL_IB_TIMEOUT = 22
[container]
runtime = "pyxis"
image = "img"
""")
    assert sites.to_options(sites.load(path)) == {
        "modules": ["a/1", "b/2"], "setup": ["ulimit -n 4096"], "venv": "/v",
        "partition": "p", "account": "acc", "qos": "q", "constraint": "c",
        "sbatch_options": ["--mem=0"], "srun_mpi": "pmi2",
        "srun_options": ["--cpu-bind=cores", "--gpu-bind=single:1", "--distribution=block"],
        "env": {"NCCL_IB_HCA": "mlx5_0", "NCCL_IB_TIMEOUT": "22"},
        "container": {"runtime": "pyxis", "image": "img"},
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('modulez = ["a"]', "unknown key 'modulez'; did you mean 'modules'?"),
        ('[srun]\ncpu_bnd = "cores"', "unknown key 'srun.cpu_bnd'; did you mean 'srun.cpu_bind'?"),
        ('[slurm]\npartition = "p"', "unknown key 'slurm'"),
        ('modules = "gcc"', "modules must be a list of strings, got str 'gcc'"),
        ("venv = 3", "venv must be a non-empty one-line string, got int 3"),
        ('modules = ["a", 2]', "modules[1] must be a non-empty one-line string, got int 2"),
        ('sbatch = "gpu"', "[sbatch] must be a table, got str 'gpu'"),
        ("[env]\nNCCL_DEBUG = true", "env.NCCL_DEBUG must be a one-line string or an integer"),
        ('[env]\nA = "x\\ny"', "env.A must be a one-line string or an integer"),
        ('[env]\n"NCCL DEBUG" = "INFO"', "env.'NCCL DEBUG' is not a shell variable name"),
        ('env = ["A=1"]', "env must be a table of NAME = value"),
        ('[srun]\ncpu_bind = "cores verbose"', "srun.cpu_bind 'cores verbose' is not an srun"),
        ('[container]\nruntime = "docker"\nimage = "i"', "container.runtime must be one of"),
        ('[container]\nruntime = "apptainer"\nimg = "i"', "unknown key 'img' (did you mean"),
        ("modules = [", "not valid TOML"),
    ],
)
def test_bad_profiles_are_refused_naming_file_and_key(text: str, message: str,
                                                      tmp_path: Path) -> None:
    assert message in refused(text, tmp_path)


def test_merge_command_line_beats_profile_lists_add() -> None:
    site = {"partition": "p", "account": "a", "modules": ["m1"], "srun_options": ["--x=1"],
            "env": {"A": "1", "B": "2"}, "venv": "/site"}
    given = {"partition": "mine", "account": None, "modules": ("m2",), "env": {"B": "3"},
             "venv": None, "nodes": 2}
    assert sites.merge(site, given) == {
        "partition": "mine", "account": "a", "modules": ("m1", "m2"),
        "srun_options": ("--x=1",), "env": {"A": "1", "B": "3"}, "venv": "/site", "nodes": 2,
    }


def test_choose_by_name_path_env_and_cluster(tmp_path: Path) -> None:
    env = no_env(tmp_path)
    assert sites.choose(None, env, ask=lambda: None) is None
    assert sites.choose("cray-ex", env) == ("cray-ex", EXAMPLES / "cray-ex.toml")
    assert sites.choose("none", {**env, "HPCDP_SITE": "/x.toml"}) is None
    # A user's profile of the same name shadows the example.
    mine = write(tmp_path / "cfg" / "hpcdp" / "sites", "cray-ex", 'clusters = ["ex9"]')
    env["XDG_CONFIG_HOME"] = str(tmp_path / "cfg")
    assert sites.choose("cray-ex", env) == ("cray-ex", mine)
    # No --site: the profile that claims the cluster, from the job's environment or Slurm.
    assert sites.choose(None, {**env, "SLURM_CLUSTER_NAME": "ex9"}) == ("cray-ex", mine)
    assert sites.choose(None, env, ask=lambda: "ex9") == ("cray-ex", mine)
    assert sites.choose(None, env, ask=lambda: "other") is None
    # HPCDP_SITE wins over the cluster's; --site over both.
    own = write(tmp_path, "lab", "")
    env["HPCDP_SITE"] = str(own)
    assert sites.choose(None, {**env, "SLURM_CLUSTER_NAME": "ex9"}) == ("lab", own)
    assert sites.choose("workstation", env)[1] == EXAMPLES / "workstation.toml"
    assert sites.choose(str(own), no_env(tmp_path)) == ("lab", own)


def test_unknown_site_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(sites.SiteError) as err:
        sites.choose("cray", no_env(tmp_path))
    text = str(err.value)
    assert text.startswith("unknown site 'cray' (did you mean 'cray-ex'?); known: cray-ex (")
    assert "infiniband (" in text and "workstation (" in text
    with pytest.raises(sites.SiteError, match="HPCDP_SITE=.*gone.toml: no such file"):
        sites.choose(None, {**no_env(tmp_path), "HPCDP_SITE": str(tmp_path / "gone.toml")})


def test_two_profiles_claiming_one_cluster_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cfg" / "hpcdp" / "sites"
    write(folder, "a", 'clusters = ["c1"]')
    write(folder, "b", 'clusters = ["c1", "c2"]')
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "SLURM_CLUSTER_NAME": "c1"}
    with pytest.raises(sites.SiteError, match=r"claimed by several site profiles \(a, b\)"):
        sites.choose(None, env)
    assert sites.choose(None, {**env, "SLURM_CLUSTER_NAME": "c2"})[0] == "b"


def test_cluster_name_from_scontrol_show_config() -> None:
    shown = "Configuration data as of now\nAccountingStorageType = x\nClusterName = ex9\n"
    assert sites.parse_cluster_name(shown) == "ex9"
    assert sites.parse_cluster_name("ClusterNames = y\n") is None
    assert sites.cluster_name({"SLURM_CLUSTER_NAME": "a"}, ask=lambda: "b") == "a"


def test_cluster_name_asked_of_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a job, the name comes from `scontrol show config` (a stand-in here)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "scontrol").write_text('#!/bin/bash\n[[ "$*" == "show config" ]] || exit 1\n'
                                     'echo "ClusterName             = ex9"\n')
    (folder / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    assert sites.cluster_name({}) == "ex9"
    mine = write(tmp_path / "cfg" / "hpcdp" / "sites", "ours", 'clusters = ["ex9"]')
    assert sites.choose(None, {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}) == ("ours", mine)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert sites.cluster_name({}) is None


def test_listing_and_showing_profiles(capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("HPCDP_SITE", raising=False)
    assert sites.main([]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [(r[0], Path(r[1])) for r in rows] == [
        (n, EXAMPLES / f"{n}.toml")
        for n in ("cray-ex", "ethernet", "infiniband", "workstation")]
    assert rows[0][2].startswith("HPE Cray EX, Slingshot 11")
    assert sites.main(["workstation"]) == 0
    assert "srun.mpi = 'pmix'" in capsys.readouterr().out.splitlines()
    assert sites.main(["nowhere"]) == 2
    assert "hpcdp sites: unknown site 'nowhere'" in capsys.readouterr().err


def test_cli_site_with_an_explicit_option_on_top(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCDP_SITE", raising=False)
    monkeypatch.delenv("SLURM_CLUSTER_NAME", raising=False)
    argv = ["render", "--site", "infiniband", "--partition", "big", "--modules", "extra/1",
            "--env", "NCCL_IB_HCA=mlx5_2", "--srun-mpi", "pmi2"]
    assert cli.main(argv) == 0
    expected: dict[str, Any] = sites.to_options(sites.load(EXAMPLES / "infiniband.toml"))
    expected.update(partition="big", srun_mpi="pmi2",
                    modules=[*expected["modules"], "extra/1"],
                    env={**expected["env"], "NCCL_IB_HCA": "mlx5_2"})
    assert capsys.readouterr().out == render(**expected)


def test_cli_errors_come_before_sbatch(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad site or profile exits 2 with the reason; sbatch is never called."""
    calls = tmp_path / "sbatch.called"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "sbatch").write_text(f"#!/bin/bash\ntouch {calls}\necho 1\n")
    (bin_ / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("HPCDP_SITE", raising=False)
    assert cli.main(["submit", "--site", "nowhere"]) == 2
    assert "hpcdp slurm submit: unknown site 'nowhere'; known: cray-ex" in capsys.readouterr().err
    bad = write(tmp_path, "bad", '[srun]\nmpii = "pmix"')
    assert cli.main(["submit", "--site", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"site profile {bad}: unknown key 'srun.mpii'; did you mean 'srun.mpi'?" in err
    assert not calls.exists()
    assert cli.main(["submit", "--site", "workstation"]) == 0  # the stand-in answers 1
    assert calls.exists() and capsys.readouterr().out == "1\n"
