"""`hpcdp report RUN`: one picture (PNG) of where each rank's time went over a run.

    hpcdp report runs/<name>                  -> runs/<name>/time.png
    hpcdp report runs/<name>/metrics.jsonl -o time.png

Read from the run's metrics.jsonl (hpcdp.train.time_split), after the fact or while it
trains. One bar per rank, stacked by phase: the rank's own time (data wait, forward and
backward, the optimizer, checkpoints, the rest of the loop) above, and below it its
waits in collectives (the gradients' all-reduce wait): a straggler is the tallest bar
above and the shortest below. A log line per rank gives the same numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from matplotlib.figure import Figure

from hpcdp.cliargs import parse_args
from hpcdp.train.reporting import read_jsonl
from hpcdp.train.time_split import OWN_PHASES, WAIT_PHASE, RankTimes, rank_times

LABELS = {"data": "data wait", "compute": "forward + backward", "optimizer": "optimizer",
          "checkpoint": "checkpoints", "other": "rest of the loop",
          "comm": "all-reduce wait"}
COLORS = {"data": "tab:orange", "compute": "tab:blue", "optimizer": "tab:green",
          "checkpoint": "tab:purple", "other": "tab:gray", "comm": "tab:red"}


def draw(times: RankTimes, title: str) -> Figure:
    """The figure: own time stacked per rank (top axes), the waits (bottom axes)."""
    fig = Figure(figsize=(max(5.0, 1.2 + 0.6 * times.ranks), 6.0), layout="constrained")
    own, wait = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    ranks = list(range(times.ranks))
    bottom = [0.0] * times.ranks
    for phase in OWN_PHASES:
        own.bar(ranks, times.seconds[phase], bottom=bottom, color=COLORS[phase],
                label=LABELS[phase])
        bottom = [b + s for b, s in zip(bottom, times.seconds[phase])]
    own.set_ylabel("own time (s)")
    own.set_title(title)
    own.legend(loc="upper left", fontsize="small")
    wait.bar(ranks, times.seconds[WAIT_PHASE], color=COLORS[WAIT_PHASE],
             label=LABELS[WAIT_PHASE])
    wait.set_ylabel("waiting (s)")
    wait.legend(loc="upper left", fontsize="small")
    wait.set_xticks(ranks, [f"rank {r}" for r in ranks])
    return fig


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
