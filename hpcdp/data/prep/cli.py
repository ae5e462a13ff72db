"""`hpcdp prep RECIPE --out DIR`: every recipe's command.

Each recipe is a `recipe.Recipe` value run by `frame.main` (docs/prep.md): the sample
sources' (`samples`: digits, synthetic, arrays; `images.cifar`) and those with
modules of their own (`RECIPES`). A module not yet a `Recipe` value has its own ``main``,
which gets the command line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hpcdp.cliargs import parse_args
from hpcdp.data.prep import frame, samples
from hpcdp.data.prep.images import cifar
from hpcdp.data.prep.recipe import Recipe

#: The recipes with a module of their own: `hpcdp prep NAME ...` runs ``module.RECIPE``
#: (or ``module.main``).
RECIPES: dict[str, tuple[str, str]] = {
    "markov": ("hpcdp.data.prep.text.markov_recipe",
               "documents from a seeded Markov chain -> token files (entropy rate known)"),
    "clicks": ("hpcdp.data.prep.clicks.recipe",
               "a synthetic click log with a planted signal -> train.h5, val.h5"),
    "images": ("hpcdp.data.prep.images.recipe",
               "an image folder (one subfolder per class) -> uint8 samples"),
    "text": ("hpcdp.data.prep.text.recipe",
             "text, JSON Lines or Parquet corpora -> token files (bytes, BPE, tokenizer.json)"),
    "criteo": ("hpcdp.data.prep.clicks.criteo_recipe",
               "Criteo click logs (plain or .gz) -> train.h5, val.h5 for the recsys task"),
    "npz": ("hpcdp.data.prep.npz", "NumPy .npz archives or folders of .npy shards -> SPLIT.h5"),
}
#: The samples recipes of small inputs, kept at hand.
SAMPLES: dict[str, Recipe] = {r.name: r for r in (samples.DIGITS, samples.SYNTHETIC,
                                                  samples.ARRAYS, cifar.RECIPE)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpcdp prep", description="Prepare a dataset as chunked HDF5, on one process or "
        "under mpirun / srun: 'hpcdp prep RECIPE --help' for a recipe's options.",
        epilog=samples.EXIT_STATUS)
    sub = parser.add_subparsers(dest="source", required=True, metavar="RECIPE")
    helps = {name: r.help for name, r in SAMPLES.items()}
    helps.update((name, help_) for name, (_, help_) in RECIPES.items())
    for name, help_ in helps.items():  # listed here, parsed by the recipe's own parser
        sub.add_parser(name, help=help_, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 written, 2 bad input (nothing written), 1 a failure while writing,
    3 a rank stalled."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SAMPLES:
        return frame.main(SAMPLES[argv[0]], argv[1:])
    if argv and argv[0] in RECIPES:
        module = importlib.import_module(RECIPES[argv[0]][0])
        if isinstance(getattr(module, "RECIPE", None), Recipe):
            return frame.main(module.RECIPE, argv[1:])
        return int(module.main(argv[1:]) or 0)
    parse_args(build_parser(), argv)  # no recipe: the usage error or the help
    return 2


if __name__ == "__main__":
    sys.exit(main())
