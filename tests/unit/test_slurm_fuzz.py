"""`hpcdp slurm render`: generated options either give a script whose #SBATCH header is
intact or a `RenderError` naming the option; the command line never ends in a traceback;
--out replaces an existing file only with --overwrite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp.cluster import cli
from hpcdp.cluster import render as slurm
from hpcdp.cluster.render import RenderError, render_options

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, print_blob=True)

TEXT = st.text(max_size=12)
LINE_BREAKS = st.tuples(TEXT, st.sampled_from(["\n", "\r", "\r\n"]), TEXT).map("".join)
ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), TEXT, LINE_BREAKS,
    st.lists(TEXT, max_size=3), st.lists(st.integers(), max_size=2),
    st.dictionaries(TEXT, TEXT, max_size=2),
    st.sampled_from(["", " ", "1\n", "٣", "10:00\n", "1-", "--mem=1G\n", "--time=5", "A\n",
                     "1-00:00:00", "99999999999999999999", -1, 0, 2**63]),
)


def header_is_intact(script: str) -> bool:
    """Everything up to the first command is the shebang, comments and #SBATCH lines."""
    head = script.split("\nset -eo pipefail\n", 1)[0]
    return all(line.startswith("#") for line in head.split("\n"))


@FUZZ
@given(name=st.sampled_from(slurm.option_names()), value=ANY_VALUE)
def test_any_value_of_any_option_renders_cleanly_or_is_named(name: str, value: Any) -> None:
    options: dict[str, Any] = {name: value}
    try:
        script = render_options(options)
    except RenderError as e:
        stem = name.rstrip("s") if name in ("modules", "overrides") else name
        assert stem in str(e) or "time" in str(e), (name, value, str(e))
        return
    assert header_is_intact(script), (name, value)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"time": "10\n"}, "time"),  # a newline after the limit split the #SBATCH line
        ({"time": "١٠"}, "time"),  # non-ASCII digits: Slurm reads only 0-9
        ({"env": {"NAME\n": "1"}}, "env name"),
        ({"nodes": True}, "nodes"),
        ({"nodes": "2"}, "nodes"),
        ({"partition": ""}, "partition"),
        ({"modules": "cuda"}, "modules"),
        ({"sbatch_options": ["--time=5"]}, "sbatch_options[0]"),
        ({"signal_lead": 3600, "time": "30"}, "signal_lead"),
        ({"exclusive": "yes"}, "exclusive"),
    ],
)
def test_known_bad_options(options: dict[str, Any], needle: str) -> None:
    with pytest.raises(RenderError) as err:
        render_options(options)
    assert needle in str(err.value)


FLAGS = ["--nodes", "--gpus-per-node", "--ntasks-per-node", "--cpus-per-task", "--time",
         "--partition", "--job-name", "--output", "--signal", "--signal-lead",
         "--sbatch-options", "--modules", "--setup", "--env", "--venv", "--config",
         "--exclusive", "--no-exclusive", "--bogus", "-x", "--site", "--srun-options",
         "--container-runtime", "--container-image", "--container-mounts"]
ARG = st.one_of(TEXT.filter(lambda t: "\0" not in t), st.sampled_from(["--", "-1", "0", "=1"]))


def main(argv: list[str]) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return code, out.getvalue(), err.getvalue()


@FUZZ
@given(pairs=st.lists(st.tuples(st.sampled_from(FLAGS), ARG, st.booleans()), max_size=4))
def test_any_command_line_renders_or_exits_2(pairs: list[tuple[str, str, bool]]) -> None:
    argv = ["render"]
    for flag, value, attached in pairs:
        argv += [f"{flag}={value}"] if attached else [flag, value]
    code, out, err = main(argv)
    assert code in (0, 2), (argv, code, err)
    if code == 0:
        assert header_is_intact(out), argv
    else:
        assert err.strip(), argv


def test_out_keeps_an_existing_file_unless_overwrite(tmp_path: Path) -> None:
    job = tmp_path / "job.sbatch"
    job.write_text("#!/bin/bash\n# edited by hand\n")
    code, _, err = main(["render", "--nodes", "2", "--out", str(job)])
    assert code == 2 and str(job) in err and "--overwrite" in err
    assert job.read_text() == "#!/bin/bash\n# edited by hand\n"
    code, _, err = main(["render", "--nodes", "2", "--out", str(job), "--overwrite"])
    assert code == 0, err
    assert job.read_text() == slurm.render(nodes=2)
    assert sorted(os.listdir(tmp_path)) == ["job.sbatch"]  # no temporary left
    for target, needle in ((tmp_path, "is a folder"), (tmp_path / "no" / "j", "does not exist")):
        code, _, err = main(["render", "--out", str(target), "--overwrite"])
        assert code == 2 and needle in err, err
    # A bad request writes nothing, even with --overwrite.
    code, _, err = main(["render", "--nodes", "0", "--out", str(job), "--overwrite"])
    assert code == 2 and "nodes" in err
    assert job.read_text() == slurm.render(nodes=2)


def test_submit_save_is_checked_before_anything_is_submitted(tmp_path: Path) -> None:
    saved = tmp_path / "saved.sbatch"
    saved.write_text("keep")
    code, _, err = main(["submit", "--save", str(saved)])
    assert code == 2 and "--overwrite" in err and saved.read_text() == "keep"


def test_the_command_exits_2_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "job.sbatch").write_text("mine")
    done = subprocess.run([sys.executable, "-m", "hpcdp", "slurm", "render", "--out",
                           "job.sbatch", "--time=10:00:00x"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "already exists" in done.stderr and (tmp_path / "job.sbatch").read_text() == "mine"
