"""Command-line parsing shared by the subcommands: argparse, minus one of its gaps.

Python 3.11's argparse turns ``--opt=--`` (or ``-o--``) into an empty list for a
single-value option, without calling the option's type or reporting an error;
the command then fails later with a TypeError and a traceback. `parse_args`
refuses such an argument as a usage error (exit status 2), like any other.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def attached_double_dash(arg: str) -> bool:
    """`--name=--`, `-o=--` or `-o--`: an option whose attached value is the bare `--`."""
    if not arg.startswith("-") or arg == "--":
        return False
    short = len(arg) == 4 and arg[1] != "-" and arg[2:] == "--"
    return arg.endswith("=--") or short


def parse_args(parser: argparse.ArgumentParser,
               argv: Sequence[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)` (None: the process's arguments), with `--opt=--` a usage
    error naming the option."""
    argv = sys.argv[1:] if argv is None else argv
    for arg in argv:
        if arg == "--":  # the rest are positional
            break
        if attached_double_dash(arg):
            parser.error(f"argument {arg[:-2].rstrip('=')}: '--' is not a value")
    return parser.parse_args(list(argv))
