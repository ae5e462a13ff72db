"""`hpcdp slurm status JOB`: what became of a job, from Slurm's accounting (sacct).

One line per run of the job (a requeued job runs again under the same id; with
`--duplicates` sacct keeps a record of each run) and one per step of each run:
state, elapsed time, peak memory (MaxRSS, per step), exit code. Where the site
keeps no accounting (`AccountingStorageType=accounting_storage/none`) or its
database cannot be reached, the message says so, and whatever slurmctld still
holds in memory (`scontrol show job`, for recent jobs) is shown instead.
Parsing is pure and tested against sacct's own output saved in tests.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

FIELDS = ("JobID", "JobName", "State", "Elapsed", "MaxRSS", "ExitCode", "NodeList")
_JOB = re.compile(r"^\d+(?:_\d+)?\Z", re.ASCII)
_SIZE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[KMGTP]?)\Z")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


class StatusError(RuntimeError):
    """No status to show: accounting off or unreachable, no such job, sacct failed."""


@dataclass
class Run:
    """One run (allocation) of a job and its steps, as sacct's records give them."""

    job: dict[str, str]
    steps: list[dict[str, str]] = field(default_factory=list)


def check_job_id(job: str) -> str:
    if not _JOB.match(job):
        raise ValueError(f"job {job!r} is not a job id like 1234 or an array task like 1234_5")
    return job


def sacct_command(job: str, sacct: str = "sacct") -> list[str]:
    # --duplicates: every run of a requeued job, not only the latest.
    return [sacct, "--jobs", job, "--duplicates", "--parsable2", f"--format={','.join(FIELDS)}"]


def parse(text: str) -> list[dict[str, str]]:
    """`sacct --parsable2` output (a header line, then `|`-separated records) as dicts."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0].split("|")
    if "JobID" not in header or "State" not in header:
        raise StatusError(f"sacct printed no header with JobID and State: {lines[0]!r}")
    records = []
    for line in lines[1:]:
        values = line.split("|")
        if len(values) != len(header):
            raise StatusError(f"sacct record {line!r} has {len(values)} fields for a header "
                              f"of {len(header)}")
        records.append(dict(zip(header, values)))
    return records


def runs(records: Sequence[Mapping[str, str]]) -> dict[str, list[Run]]:
    """Records grouped by job (array task) and run: a job record opens a run, its steps
    (`<id>.batch`, `<id>.0`, ...) follow it in sacct's order."""
    grouped: dict[str, list[Run]] = {}
    for rec in records:
        job_id, dot, _ = rec["JobID"].partition(".")
        if not dot:
            grouped.setdefault(job_id, []).append(Run(dict(rec)))
        elif grouped.get(job_id):
            grouped[job_id][-1].steps.append(dict(rec))
    return grouped


def rss_text(value: str) -> str:
    """sacct's MaxRSS ("123456K") in binary units; empty stays empty."""
    m = _SIZE.match(value.strip())
    if m is None:
        return value.strip()
    size = float(m["n"]) * _UNITS[m["unit"]]
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return value  # pragma: no cover - the loop always returns


def report(records: Sequence[Mapping[str, str]]) -> str:
    """The status text: per job, its final state and restarts, then a table of runs/steps."""
    out = []
    for job_id, job_runs in runs(records).items():
        last = job_runs[-1].job
        out.append(f"job {job_id} ({last.get('JobName', '')}): {last['State']}, "
                   f"{len(job_runs) - 1} restart(s)")
        rows = [("run", "step", "state", "elapsed", "max RSS", "exit", "nodes")]
        for n, run in enumerate(job_runs):
            for rec in (run.job, *run.steps):
                step = rec["JobID"].partition(".")[2] or "job"
                rows.append((str(n), step, rec["State"], rec.get("Elapsed", ""),
                             rss_text(rec.get("MaxRSS", "")), rec.get("ExitCode", ""),
                             rec.get("NodeList", "")))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(out) + "\n"


def explain_failure(returncode: int, stderr: str) -> str:
    """Why sacct gave nothing, in words a user can act on."""
    text = stderr.strip()
    if "accounting storage is disabled" in text.lower():
        return ("Slurm accounting is off on this cluster (AccountingStorageType="
                "accounting_storage/none): sacct keeps no record of jobs, so there are no "
                "per-step states, memory peaks or exit codes to show")
    if "talking to the database" in text or "persistent connection" in text:
        first = text.splitlines()[-1] if text else ""
        return f"sacct cannot reach the accounting database (slurmdbd): {first}"
    return f"sacct failed (exit {returncode}): {text or '(no message)'}"


def scontrol_fallback(text: str) -> str:
    """`scontrol show job -o` lines (one per job or array task) as a short table."""
    keys = ("JobId", "JobName", "JobState", "Restarts", "RunTime", "ExitCode", "Reason")
    rows = [keys]
    for line in text.splitlines():
        info: dict[str, str] = {}
        for item in line.split():
            name, sep, value = item.partition("=")
            if sep and name not in info:
                info[name] = value
        if "ArrayTaskId" in info:  # an array task's own JobId means little to its user
            info["JobId"] = f"{info['ArrayJobId']}_{info['ArrayTaskId']}"
        if "JobId" in info:
            rows.append(tuple(info.get(k, "") for k in keys))
    if len(rows) == 1:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(keys))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in rows) + "\n"


def status(job: str, sacct: str = "sacct", scontrol: str = "scontrol",
           timeout: float = 60.0) -> str:
    """The status text for `job`, or StatusError saying why there is none."""
    check_job_id(job)
    try:
        done = subprocess.run(sacct_command(job, sacct), capture_output=True, text=True,
                              timeout=timeout, check=False)
    except FileNotFoundError:
        raise StatusError(f"{sacct} not found: is Slurm's client installed here?") from None
    except subprocess.TimeoutExpired:
        raise StatusError(f"sacct did not answer within {timeout:.0f}s") from None
    if done.returncode == 0:
        records = parse(done.stdout)
        if not records:
            raise StatusError(f"sacct has no record of job {job} (a wrong id, or a job "
                              "from before the accounting database's purge)")
        return report(records)
    why = explain_failure(done.returncode, done.stderr)
    try:
        shown = subprocess.run([scontrol, "show", "job", "-o", job], capture_output=True,
                               text=True, timeout=timeout, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        shown = None
    table = scontrol_fallback(shown.stdout) if shown and shown.returncode == 0 else ""
    if not table:
        raise StatusError(f"{why}; slurmctld no longer holds job {job} either "
                          "(scontrol show job knows only recent jobs)")
    return (f"{why}.\nWhat slurmctld still holds (no steps, no memory figures):\n{table}")
