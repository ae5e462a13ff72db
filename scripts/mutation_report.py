"""Per-module mutation scores from mutmut's results, less the listed equivalent mutants.

Reads mutants/**/*.py.meta (what `mutmut run` leaves: each mutant's exit code;
1 means a test failed, so the mutant was killed; a timeout means the tests hung,
which a time-bounded suite counts as a failure too) and tests/mutation/equivalent.toml
(mutants that cannot change behaviour, each with its reason). Prints one row a
module and exits 1 when a module keeps more than --max-survivors of its mutants.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import tomllib

KILLED, SURVIVED = 1, 0
#: mutmut's codes for a mutant whose tests ran past its time limit (SIGXCPU, its own 36):
#: the mutant made them hang, so it is detected, and counted with the killed.
TIMEOUTS = frozenset({36, 24, -24, 152, 255})


def module_of(key: str) -> str:
    """'hpcdp.train.schedule.x_lr_at__mutmut_3' -> 'hpcdp.train.schedule'."""
    return key.rsplit(".", 1)[0]


def tally(codes: dict[str, int | None], equivalent: set[str]) -> dict[str, Counter]:
    """{module: Counter(killed, timeout, survived, equivalent, other)} from exit codes (pure)."""
    per: dict[str, Counter] = {}
    for key, code in codes.items():
        c = per.setdefault(module_of(key), Counter())
        if key in equivalent:
            c["equivalent"] += 1
        elif code == KILLED:
            c["killed"] += 1
        elif code in TIMEOUTS:
            c["timeout"] += 1
        elif code == SURVIVED:
            c["survived"] += 1
        else:  # no tests reached it, timeout, suspicious: counted against the module
            c["other"] += 1
    return per


def survivor_share(c: Counter) -> float:
    judged = c["killed"] + c["timeout"] + c["survived"] + c["other"]
    return (c["survived"] + c["other"]) / judged if judged else 0.0


def load(root: Path) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for meta in sorted(root.glob("**/*.py.meta")):
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return codes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mutants", default="mutants", help="mutmut's output folder")
    p.add_argument("--equivalent", default="tests/mutation/equivalent.toml")
    p.add_argument("--max-survivors", type=float, default=0.10)
    args = p.parse_args(argv)
    codes = load(Path(args.mutants))
    if not codes:
        print(f"no mutmut results under {args.mutants}/: run `make mutate`", file=sys.stderr)
        return 2
    listed = tomllib.loads(Path(args.equivalent).read_text()) if Path(
        args.equivalent).exists() else {}
    stale = sorted(set(listed) - set(codes))
    per = tally(codes, set(listed))
    print(f"{'module':<28} {'mutants':>7} {'killed':>7} {'timeout':>7} {'survived':>8} "
          f"{'untested':>8} {'equiv.':>6} {'surviving':>9}")
    failed = False
    for module, c in sorted(per.items()):
        share = survivor_share(c)
        failed |= share > args.max_survivors
        print(f"{module:<28} {sum(c.values()):>7} {c['killed']:>7} {c['timeout']:>7} "
              f"{c['survived']:>8} {c['other']:>8} {c['equivalent']:>6} {share:>8.1%}")
    for key in stale:
        print(f"note: {key} is listed as equivalent but no longer exists", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
