"""`hpcdp slurm status`: sacct's output parsed and reported (no Slurm needed).

The files in sacct/ are what sacct and scontrol (Slurm 22.05) printed on the local
cluster with slurmdbd accounting: a prep job, a training job requeued once by
hpcdp's preemption path, a two-task sweep array, a failing job, two singleton
segments; and, with accounting off or its database down, sacct's error output.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcdp.cluster import cli, jobstatus
from hpcdp.cluster.jobstatus import StatusError

DATA = Path(__file__).resolve().parent / "sacct"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def test_a_requeued_job_has_one_run_per_start_and_its_steps() -> None:
    records = jobstatus.parse(recorded("requeued.txt"))
    [(job, runs)] = jobstatus.runs(records).items()
    assert job == "2" and len(runs) == 2
    assert [r.job["State"] for r in runs] == ["REQUEUED", "COMPLETED"]
    assert [s["JobID"] for s in runs[1].steps] == ["2.batch", "2.0"]
    text = jobstatus.report(records).splitlines()
    assert text[0] == "job 2 (chain-train): COMPLETED, 1 restart(s)"
    assert text[1].split() == ["run", "step", "state", "elapsed", "max", "RSS", "exit", "nodes"]
    assert text[3].split() == ["0", "batch", "COMPLETED", "00:00:32", "14.8", "MiB", "0:0",
                               "node1"]
    assert text[7].split() == ["1", "0", "COMPLETED", "00:00:30", "356.7", "MiB", "0:0", "node1"]


def test_array_tasks_failures_and_segments() -> None:
    lines = jobstatus.report(jobstatus.parse(recorded("array.txt"))).splitlines()
    assert "job 3_0 (lr-sweep): COMPLETED, 0 restart(s)" in lines
    assert "job 3_1 (lr-sweep): COMPLETED, 0 restart(s)" in lines
    lines = jobstatus.report(jobstatus.parse(recorded("prep.txt"))).splitlines()
    assert lines[0] == "job 1 (hpcdp-prep): COMPLETED, 0 restart(s)"
    assert [line.split()[1] for line in lines[2:]] == ["job", "batch", "0"]
    lines = jobstatus.report(jobstatus.parse(recorded("failed.txt"))).splitlines()
    assert lines[0] == "job 5 (fails): FAILED, 0 restart(s)"
    assert lines[2].split() == ["0", "job", "FAILED", "00:00:00", "3:0", "node2"]
    # A segment stopped for want of requeue (exit 76), the next one finished.
    lines = jobstatus.report(jobstatus.parse(recorded("segments.txt"))).splitlines()
    assert lines[0] == "job 6 (seg): FAILED, 0 restart(s)"
    assert "job 7 (seg): COMPLETED, 0 restart(s)" in lines
    assert any(line.split()[1:3] == ["0", "FAILED"] and "76:0" in line for line in lines)


def test_rss_in_binary_units() -> None:
    assert [jobstatus.rss_text(v) for v in ("", "512", "10192K", "2.5G", "x")] == [
        "", "512 B", "10.0 MiB", "2.5 GiB", "x"]


def test_malformed_output_and_job_ids() -> None:
    assert jobstatus.parse(recorded("unknown.txt")) == []
    with pytest.raises(StatusError, match="no header"):
        jobstatus.parse("1|a|b\n")
    with pytest.raises(StatusError, match="has 2 fields"):
        jobstatus.parse("JobID|State|Elapsed\n1|RUNNING\n")
    for bad in ("", "12;rm", "12_", "-1", "1.batch"):
        with pytest.raises(ValueError, match="is not a job id"):
            jobstatus.check_job_id(bad)


def test_accounting_off_or_unreachable_is_said_plainly() -> None:
    why = jobstatus.explain_failure(1, recorded("disabled.stderr"))
    assert "accounting is off on this cluster" in why
    why = jobstatus.explain_failure(1, recorded("unreachable.stderr"))
    assert why.startswith("sacct cannot reach the accounting database (slurmdbd)")
    assert "Connection refused" in why
    assert jobstatus.explain_failure(2, "boom") == "sacct failed (exit 2): boom"


def test_scontrol_fallback_names_array_tasks() -> None:
    table = jobstatus.scontrol_fallback(recorded("scontrol-array.txt")).splitlines()
    assert table[0].split() == ["JobId", "JobName", "JobState", "Restarts", "RunTime",
                                "ExitCode", "Reason"]
    assert sorted(line.split()[0] for line in table[1:]) == ["3_0", "3_1"]
    table = jobstatus.scontrol_fallback(recorded("scontrol-requeued.txt")).splitlines()
    assert table[1].split() == ["2", "chain-train", "COMPLETED", "1", "00:00:31", "0:0", "None"]
    assert jobstatus.scontrol_fallback("") == ""


def standins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sacct: str, scontrol: str) -> None:
    """sacct and scontrol stand-ins that print recorded output (and record sacct's argv)."""
    for name, text in (("sacct", sacct), ("scontrol", scontrol)):
        (tmp_path / name).write_text(f"#!/bin/bash\n{text}\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_status_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    standins(tmp_path, monkeypatch, f'echo "$@" > {tmp_path}/argv; cat {DATA}/requeued.txt',
             "exit 1")
    assert cli.main(["status", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job 2 (chain-train): COMPLETED, 1 restart(s)\n")
    argv = (tmp_path / "argv").read_text().split()
    assert argv == ["--jobs", "2", "--duplicates", "--parsable2",
                    "--format=JobID,JobName,State,Elapsed,MaxRSS,ExitCode,NodeList"]
    assert cli.main(["status", "2;x"]) == 2
    assert "is not a job id" in capsys.readouterr().err


def test_status_without_accounting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    standins(tmp_path, monkeypatch, f"cat {DATA}/disabled.stderr >&2; exit 1",
             f"cat {DATA}/scontrol-requeued.txt")
    assert cli.main(["status", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Slurm accounting is off on this cluster")
    assert "What slurmctld still holds" in out and "chain-train" in out
    standins(tmp_path, monkeypatch, f"cat {DATA}/disabled.stderr >&2; exit 1",
             "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1")
    assert cli.main(["status", "2"]) == 1
    err = capsys.readouterr().err
    assert "accounting is off" in err and "slurmctld no longer holds job 2" in err
    standins(tmp_path, monkeypatch, f"cat {DATA}/unknown.txt", "exit 1")
    assert cli.main(["status", "999"]) == 1
    assert "sacct has no record of job 999" in capsys.readouterr().err
