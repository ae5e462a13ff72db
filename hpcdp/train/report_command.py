"""`hpcdp report RUN`: one picture (PNG) of where each rank's time went over a run.

    hpcdp report runs/<name>                  -> runs/<name>/time.png
    hpcdp report runs/<name>/metrics.jsonl -o time.png

Read from the run's metrics.jsonl (hpcdp.train.time_split), after the fact or while it
trains. One bar per rank on one scale, stacked by phase: the rank's own time (data
wait, forward and backward, the optimizer, checkpoints, the rest of the loop) above the
zero line, its waits in collectives (the gradients' all-reduce wait) below it: a
straggler is the tallest bar above and the shortest below. A line per rank printed
gives the same numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from hpcdp.cliargs import parse_args
from hpcdp.train.reporting import read_jsonl
from hpcdp.train.time_split import OWN_PHASES, WAIT_PHASE, RankTimes, rank_times

LABELS = {"data": "data wait", "compute": "forward + backward", "optimizer": "optimizer",
          "checkpoint": "checkpoints", "other": "rest of the loop",
          "comm": "all-reduce wait"}
COLORS = {"data": "tab:orange", "compute": "tab:blue", "optimizer": "tab:green",
          "checkpoint": "tab:purple", "other": "tab:gray", "comm": "tab:red"}


def draw(times: RankTimes, title: str) -> Figure:
    """The figure, on one scale: each rank's own time stacked up from zero, its waits in
    collectives down from it."""
    fig = Figure(figsize=(max(6.0, 3.4 + 0.6 * times.ranks), 5.0), layout="constrained")
    ax = fig.subplots()
    ranks = list(range(times.ranks))
    bottom = [0.0] * times.ranks
    for phase in OWN_PHASES:
        ax.bar(ranks, times.seconds[phase], bottom=bottom, color=COLORS[phase],
               label=LABELS[phase])
        bottom = [b + s for b, s in zip(bottom, times.seconds[phase])]
    ax.bar(ranks, [-s for s in times.seconds[WAIT_PHASE]], color=COLORS[WAIT_PHASE],
           hatch="//", label=LABELS[WAIT_PHASE] + " (below 0)")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{abs(v):g}"))
    ax.set_ylabel("seconds: own time above 0, waiting below")
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_title(title, fontsize="medium")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig


def bars(ax: Any) -> tuple[list[float], list[float]]:
    """Read the drawn bars back from the Axes: each rank's top above zero and depth below
    it (what the picture shows, for tests and for checking a picture by its data)."""
    columns = list(zip(*ax.containers))  # one tuple of bars (a segment per phase) per rank
    tops = [max(b.get_y() + b.get_height() for b in col) for col in columns]
    depths = [-min(b.get_y() + min(b.get_height(), 0.0) for b in col) for col in columns]
    return tops, depths


def text(times: RankTimes) -> str:
    """The table the picture is drawn from, one line per rank."""
    phases = [*OWN_PHASES, WAIT_PHASE]
    lines = ["rank  " + "  ".join(f"{p:>10}" for p in phases) + "   own total (s)"]
    for r, total in enumerate(times.own()):
        lines.append(f"{r:>4}  " + "  ".join(f"{times.seconds[p][r]:>10.3f}" for p in phases)
                     + f"   {total:.3f}")
    lines.append(f"most own time: rank {times.slowest()} (over {times.records} records, "
                 f"to step {times.steps})")
    return "\n".join(lines)


def metrics_file(target: Path) -> Path:
    return target / "metrics.jsonl" if target.is_dir() else target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hpcdp report", description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a run folder, or its metrics.jsonl")
    ap.add_argument("-o", "--output", type=Path, default=None,
                    help="the PNG to write (default: time.png beside metrics.jsonl)")
    args = parse_args(ap, argv)
    path = metrics_file(args.run)
    if not path.is_file():
        print(f"hpcdp report: {path} does not exist (a run folder holds metrics.jsonl "
              "while log.jsonl is on)", file=sys.stderr)
        return 2
    try:
        times = rank_times(read_jsonl(path))
    except ValueError as e:
        print(f"hpcdp report: {path}: {e}", file=sys.stderr)
        return 2
    out = args.output or path.with_name("time.png")
    title = f"where each rank's time went: {path.parent.name}, steps 1-{times.steps}"
    draw(times, title).savefig(out, dpi=100)
    print(text(times))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
