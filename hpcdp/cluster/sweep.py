"""Hyperparameter sweeps as Slurm job arrays: override sets in, one table of results out.

A sweep is a list of override sets (`{"optim.lr": 0.1, ...}`), read from a TOML
file (`[[task]]` tables, or one `[grid]` of lists), a CSV file (a header of keys,
one row per task) or `--grid key=v1,v2` options (every combination). Every set is
checked against the real config schema before anything is submitted; the sets are
then saved as `sweep.json` in the sweep folder, and each array task, started with
`HPCDP_SWEEP` pointing at that file, takes the set at its SLURM_ARRAY_TASK_ID and
its own run folder (`task-<i>` in the sweep folder). `collect` reads every task's
summary.json back into one table and, optionally, a plot.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcdp import config as cfgmod
from hpcdp import files
from hpcdp.config import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

#: The file each array task reads its override set from, in the sweep folder.
SWEEP_FILE = "sweep.json"
#: The environment variable that points an array task at its sweep file.
ENV = "HPCDP_SWEEP"
#: Keys the sweep sets itself, per task.
OWNED = ("run.dir",)
# The variables a job has and a login node does not: placeholders while checking.
JOB_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")

OverrideSet = dict[str, Any]


class SweepError(ValueError):
    """A sweep that cannot run: empty, a key that is not a config key, a bad value."""


# ---- reading override sets ------------------------------------------------------------


def flatten(table: Mapping[str, Any], where: str) -> OverrideSet:
    """{"optim": {"lr": 0.1}} or {"optim.lr": 0.1} -> {"optim.lr": 0.1}; section.key only."""
    flat: OverrideSet = {}
    for name, value in table.items():
        if isinstance(value, Mapping):
            for key, inner in value.items():
                if isinstance(inner, Mapping):
                    raise SweepError(f"{where}: {name}.{key} is a table; a sweep sets "
                                     "section.key values")
                flat[f"{name}.{key}"] = inner
        else:
            flat[name] = value
    for key in flat:
        if key.count(".") != 1 or not all(key.split(".")):
            raise SweepError(f"{where}: {key!r} is not a config key like optim.lr")
    return flat


def split_values(text: str) -> list[str]:
    """`0.1,0.2,[1,2],"a,b"` -> the four values: commas inside [] or quotes do not split."""
    items, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items]


def parse_value(key: str, raw: str) -> Any:
    """A value as an override reads it: TOML when it parses, else the bare word."""
    return cfgmod.parse_override(f"{key}={raw}")[2]


def grid(axes: Mapping[str, Sequence[Any]], where: str) -> list[OverrideSet]:
    """Every combination of the axes' values, the first axis varying slowest."""
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{where}: {key} needs a non-empty list of values, got {values!r}")
    keys = list(axes)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]


def grid_options(options: Sequence[str]) -> list[OverrideSet]:
    """`--grid optim.lr=0.05,0.1 --grid data.global_batch_size=32,64` -> the product."""
    axes: dict[str, list[Any]] = {}
    for option in options:
        key, sep, raw = option.partition("=")
        key = key.strip()
        if not sep or not raw.strip():
            raise SweepError(f"--grid {option!r}: expected key=value1,value2,...")
        if key in axes:
            raise SweepError(f"--grid {option!r}: {key} is given twice")
        axes[key] = [parse_value(key, v) for v in split_values(raw)]
    flatten(axes, "--grid")  # the key shape
    return grid(axes, "--grid")


def read_toml(path: Path) -> list[OverrideSet]:
    """`[[task]]` tables, one set each, or one `[grid]` table of lists."""
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SweepError(f"sweep file {path}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - {"task", "grid"})
    if unknown or ("task" in data) == ("grid" in data):
        what = "both" if "task" in data and "grid" in data else "neither"
        raise SweepError(f"sweep file {path}: expected [[task]] tables (one override set "
                         f"each) or one [grid] table of lists; found {what}"
                         + (f", and unknown: {', '.join(unknown)}" if unknown else ""))
    if "grid" in data:
        return grid(flatten(data["grid"], f"sweep file {path} [grid]"), f"sweep file {path}")
    if not isinstance(data["task"], list):
        raise SweepError(f"sweep file {path}: write [[task]] (an array of tables), not [task]")
    return [flatten(t, f"sweep file {path} task {i}") for i, t in enumerate(data["task"])]


def read_csv(path: Path) -> list[OverrideSet]:
    """A header of config keys, then one row of values per task."""
    try:
        rows = list(csv.reader(io.StringIO(path.read_text(), newline="")))
    except (csv.Error, UnicodeDecodeError) as e:
        raise SweepError(f"sweep file {path}: not a CSV file: {e}") from None
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        return []
    header = [h.strip() for h in rows[0]]
    flatten(dict.fromkeys(header), f"sweep file {path} header")
    if len(set(header)) != len(header):
        raise SweepError(f"sweep file {path}: a key appears twice in the header {header}")
    sets = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise SweepError(f"sweep file {path} line {line}: {len(row)} values for "
                             f"{len(header)} keys")
        for key, cell in zip(header, row):
            if not cell.strip():
                raise SweepError(f"sweep file {path} line {line}: {key} is empty")
        sets.append({key: parse_value(key, cell.strip()) for key, cell in zip(header, row)})
    return sets


def read_sets(path: str | None, grid_opts: Sequence[str]) -> tuple[list[OverrideSet], str]:
    """The override sets and where they came from: a TOML/CSV file or --grid options."""
    if path is not None and grid_opts:
        raise SweepError("give either --array FILE or --grid options, not both")
    if path is None and not grid_opts:
        raise SweepError("a sweep needs --array FILE or --grid key=v1,v2 options")
    if path is None:
        sets, source = grid_options(grid_opts), "--grid " + " --grid ".join(grid_opts)
    else:
        p = Path(path)
        if not p.is_file():
            raise SweepError(f"sweep file {path}: does not exist (or is not a file)")
        if p.suffix.lower() == ".toml":
            sets = read_toml(p)
        elif p.suffix.lower() == ".csv":
            sets = read_csv(p)
        else:
            raise SweepError(f"sweep file {path}: expected a .toml or .csv file")
        source = str(p)
    if not sets:
        raise SweepError(f"{source}: no override sets; a sweep needs at least one task")
    return sets, source


# ---- checking against the config schema -----------------------------------------------


def literal(value: Any) -> str:
    """A value as TOML text, so that an override reads back the same value and type."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    raise SweepError(f"value {value!r} ({type(value).__name__}) cannot be a config value")


def overrides_of(values: Mapping[str, Any]) -> list[str]:
    """`key=literal` overrides, each checked to read back as the value it came from."""
    out = []
    for key, value in values.items():
        text = f"{key}={literal(value)}"
        back = cfgmod.parse_override(text)[2]
        if back != value or type(back) is not type(value):
            raise SweepError(f"{key}={value!r} cannot be passed on as an override "
                             f"(it reads back as {back!r})")
        out.append(text)
    return out


def task_dir(sweep_dir: Path, index: int) -> Path:
    return sweep_dir / f"task-{index}"


Builder = Callable[..., cfgmod.Config]


def check(sets: Sequence[OverrideSet], source: str, config: str | None,
          overrides: Sequence[str], sweep_dir: Path, build: Builder) -> None:
    """Build every task's config as its rank will (file, fixed overrides, its set).

    `build` is config.build with the tasks' defaults; job variables get placeholder
    values. Errors name the task and its set. Tasks that would share a checkpoint
    folder are refused: each would resume from the others' checkpoints.
    """
    for text in overrides:
        if text.split("=", 1)[0].strip() in OWNED:
            raise SweepError(f"override {text!r}: a sweep gives each task its own run "
                             f"folder ({task_dir(sweep_dir, 0).name}, ... in the sweep "
                             "folder); leave run.dir out")
    ckpt_dirs: dict[str, int] = {}
    for i, values in enumerate(sets):
        where = f"{source}: task {i} ({', '.join(f'{k}={v!r}' for k, v in values.items())})"
        owned = sorted(set(values) & set(OWNED))
        if owned:
            raise SweepError(f"{where}: {', '.join(owned)} is set by the sweep itself")
        environ = {**os.environ, **dict.fromkeys(JOB_VARS, "0"), "SLURM_ARRAY_TASK_ID": str(i)}
        try:
            task_overrides = overrides_of(values)
            cfg = build(config, [*overrides, *task_overrides,
                                 f"run.dir={literal(str(task_dir(sweep_dir, i)))}"], environ)
        except (ConfigError, SweepError) as e:
            raise SweepError(f"{where}: {e}") from None
        ckpt = str(cfg.checkpoint_dir)
        if ckpt in ckpt_dirs:
            raise SweepError(f"{where}: checkpoint.dir {ckpt!r} is also task "
                             f"{ckpt_dirs[ckpt]}'s; leave checkpoint.dir empty (each task "
                             "keeps its checkpoints in its run folder)")
        ckpt_dirs[ckpt] = i


# ---- the sweep file, written at submission and read by each task ----------------------


def record(sets: Sequence[OverrideSet], source: str, sweep_dir: Path) -> dict[str, Any]:
    keys = list(dict.fromkeys(k for s in sets for k in s))
    tasks = [{"run_dir": str(task_dir(sweep_dir, i)), "overrides": dict(s)}
             for i, s in enumerate(sets)]
    return {"source": source, "keys": keys, "tasks": tasks}


def save(sweep_dir: Path, data: Mapping[str, Any]) -> Path:
    """Write sweep.json; an existing different one is refused (its runs would mix)."""
    path = sweep_dir / SWEEP_FILE
    text = json.dumps(data, indent=2) + "\n"
    if path.exists():
        if path.read_text() != text:
            raise SweepError(f"{path} already holds another sweep; choose another --sweep-dir "
                             "(the same sweep again is fine: its tasks resume)")
        return path
    sweep_dir.mkdir(parents=True, exist_ok=True)
    return files.write_atomic(path, text)


def load(path: str | Path) -> dict[str, Any]:
    """A sweep.json, with errors naming the file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"sweep file {p}: cannot be read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"sweep file {p}: not a sweep written by hpcdp: {e}") from None
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, list) or not all(
            isinstance(t, dict) and isinstance(t.get("overrides"), dict)
            and isinstance(t.get("run_dir"), str) for t in tasks):
        raise ConfigError(f"sweep file {p}: not a sweep written by hpcdp (no task list)")
    return data


def task_overrides(environ: Mapping[str, str]) -> list[str]:
    """This array task's overrides when HPCDP_SWEEP names a sweep file; else none.

    Read by every rank before any collective, so a bad file fails alike on each.
    """
    path = environ.get(ENV)
    if not path:
        return []
    index = environ.get("SLURM_ARRAY_TASK_ID", "")
    if not index.isdigit():
        raise ConfigError(f"{ENV}={path}, but SLURM_ARRAY_TASK_ID is {index or 'not set'}: "
                          "a sweep runs as a job array (hpcdp slurm submit --array)")
    tasks = load(path)["tasks"]
    if int(index) >= len(tasks):
        raise ConfigError(f"sweep file {path} has {len(tasks)} task(s); there is no task "
                          f"{index}")
    task = tasks[int(index)]
    try:
        return [*overrides_of(task["overrides"]), f"run.dir={literal(task['run_dir'])}"]
    except SweepError as e:
        raise ConfigError(f"sweep file {path} task {index}: {e}") from None


# ---- collecting the results ------------------------------------------------------------


def collect(sweep_dir: str | Path) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per task: its index, swept values, state and summary.json's numbers."""
    sweep_dir = Path(sweep_dir)
    try:
        data = load(sweep_dir / SWEEP_FILE)
    except ConfigError as e:
        raise SweepError(str(e)) from None
    keys: list[str] = list(data.get("keys", []))
    rows, metrics = [], {}
    for i, task in enumerate(data["tasks"]):
        row: dict[str, Any] = {"task": i, **task["overrides"]}
        summary_path = Path(task["run_dir"]) / "summary.json"
        try:
            summary = json.loads(summary_path.read_text())
            row["state"] = "done"
        except FileNotFoundError:
            started = Path(task["run_dir"]).is_dir()
            summary, row["state"] = {}, "unfinished" if started else "not started"
        except (OSError, json.JSONDecodeError) as e:
            summary, row["state"] = {}, f"unreadable summary.json: {e}"
        for name, value in summary.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[name] = value
                metrics[name] = None
        rows.append(row)
    return ["task", *keys, "state", *metrics], rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value if isinstance(value, str) else json.dumps(value)


def table(columns: Sequence[str], rows: Sequence[Mapping[str, Any]], fmt: str) -> str:
    """The rows as CSV or a markdown table."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(cells)
        return out.getvalue()
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def series(rows: Sequence[Mapping[str, Any]], x: str, metric: str,
           keys: Sequence[str]) -> dict[str, list[tuple[Any, float]]]:
    """The finished tasks' (x, metric) points, one series per setting of the other keys."""
    out: dict[str, list[tuple[Any, float]]] = {}
    for row in rows:
        value = row.get(metric)
        if x not in row or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        label = ", ".join(f"{k}={_cell(row.get(k))}" for k in keys if k != x) or metric
        out.setdefault(label, []).append((row[x], float(value)))
    for points in out.values():
        points.sort(key=lambda p: (not isinstance(p[0], (int, float)), p[0]))
    return out


def plot(rows: Sequence[Mapping[str, Any]], x: str, metric: str, keys: Sequence[str],
         path: str) -> int:
    """A PNG of `metric` against the swept `x`; the number of points drawn."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a login node
    import matplotlib.pyplot as plt

    lines = series(rows, x, metric, keys)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in lines.items():
        xs = [p[0] if isinstance(p[0], (int, float)) else str(p[0]) for p in points]
        ax.plot(xs, [p[1] for p in points], marker="o", label=label)
    numeric = all(isinstance(p[0], (int, float)) for pts in lines.values() for p in pts)
    positive = numeric and all(p[0] > 0 for pts in lines.values() for p in pts)
    xs_all = {p[0] for pts in lines.values() for p in pts}
    if positive and len(xs_all) > 1 and max(xs_all) / min(xs_all) >= 10:
        ax.set_xscale("log")  # learning rates and batch sizes are swept by factors
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    if len(lines) > 1:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return sum(len(p) for p in lines.values())
