"""A preparation recipe as a value: what is particular to one input format, and nothing else.

A `Recipe` is frozen data and functions (no subclassing, like `hpcdp.tasks.Task`), run by
`frame.main(recipe, argv)`, which owns everything else: the ranks (`world`), the common
options (``--out``, ``--overwrite``, ``--resume``, ``--stall-timeout`` and, with
`block_mib`, ``--block-mib``), the output checks, the fingerprint, the progress, the stall
guard, the exit statuses, the parts, the merge and the rename. The steps, each on every
rank:

1. ``options(parser)`` adds the recipe's own options;
2. ``check(args, comm) -> Inputs``: every check of the options and input files, raising
   one of `bad_input` (`PrepError` names the problem); what it returns is the only thing
   any later step reads, never ``args``. ``outputs(inputs)`` names the files it writes in
   ``--out``. The fingerprint a resume must match is `Inputs` itself (a dataclass: its
   fields, those of a dataclass field merged in, a field marked ``metadata=SAME_BYTES``
   left out) plus the size and time of each of ``files(inputs)``;
3. ``splits(inputs)``: one `Split` per file, its blocks planned from the input alone;
   ``read_block(inputs, split, block)`` turns one block into a part (named arrays);
4. ``tally(inputs, split, parts, mine, comm)`` (collective, optional): what a split's
   file needs from every rank's parts (the largest token, the click rate);
   ``datasets(inputs, split, f, totals, tally)`` creates the file's datasets (each filled
   from the part array of its key; `totals` maps an array to its rows) and
   ``attributes(inputs, split, totals, tally)`` its root attributes (`merge.root_attrs`);
5. ``summary(inputs, written, seconds, ranks)``: rank 0's report of what was written.

A recipe with a write phase of its own (images agree on undecodable files before any file
is made; a Criteo vocabulary) sets `write`: it gets a `Run` and returns what `summary`
reads, saving parts and writing files through ``run.save`` and ``run.write`` (or its own
loop), still inside the frame's parts, stall guard and exit statuses.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp.data.prep.parts import SAME_BYTES
from hpcdp.data.prep.world import PrepError

__all__ = ["SAME_BYTES", "Recipe", "Run", "Split"]

#: The refusal of an existing output without ``--overwrite`` (``out``, ``names``: those
#: found, ``first``: the first one's path).
REFUSAL = "--out {out}: {names} already exist; pass --overwrite to replace them"


@dataclass(frozen=True)
class Split:
    """One file of the output (``OUT/NAME.h5``) and the blocks its parts are made from."""

    name: str
    #: The blocks, the same on any number of ranks: item ranges (`blocks.plan_items`) or
    #: byte ranges (`blocks.plan_blocks`); progress counts ``len`` or ``nbytes`` of each.
    blocks: Sequence[Any]
    what: str  # progress while saving: "SPLIT: what" in units of `unit`
    unit: str
    slab_rows: int  # rows copied per write
    file_unit: str | None = None  # progress while writing the file, in its first array's rows
    serial: bool = False  # rank 0 writes alone (filtered datasets)
    collective: bool = False  # collective MPI-IO transfers
    #: An array of offsets into another: (that array, rows above it, which rank 0 fills
    #: with 0) (`merge.write_parts`).
    shift: dict[str, tuple[str, int]] | None = None
    source: Any = None  # what the recipe reads this split from (a `arrays.Source`, ...)
    #: The parts whose arrays together are a block's rows, when not the one of the split's
    #: name (Criteo's rows parsed before its vocabulary, beside the ids made after it).
    parts: tuple[str, ...] = ()


def _no_files(inputs: Any) -> Sequence[str]:
    return ()


def _no_tally(inputs: Any, split: Split, parts: Any, mine: range, comm: Any) -> Any:
    return None


def _no_attributes(inputs: Any, split: Split, totals: dict[str, int], tally: Any
                   ) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Recipe:
    """One input format's preparation (see the module doc for the order of the steps)."""

    name: str  # `hpcdp prep NAME`, and the fingerprint's recipe
    help: str  # one line in `hpcdp prep --help`
    options: Callable[[argparse.ArgumentParser], None]
    check: Callable[[argparse.Namespace, Any], Any]  # (args, comm) -> Inputs
    outputs: Callable[[Any], Sequence[str]]  # the files written in --out
    splits: Callable[[Any], Sequence[Split]]
    read_block: Callable[[Any, Split, Any], dict[str, np.ndarray]] | None  # None: `write`'s
    datasets: Callable[[Any, Split, Any, dict[str, int], Any], dict[str, Any]]
    summary: Callable[[Any, Any, float, int], None]  # (inputs, written, seconds, ranks)
    attributes: Callable[[Any, Split, dict[str, int], Any], dict[str, Any]] = _no_attributes
    tally: Callable[[Any, Split, Any, range, Any], Any] = _no_tally
    files: Callable[[Any], Sequence[str]] = _no_files  # input files: size and time checked
    write: Callable[[Run], Any] | None = None  # a write phase of the recipe's own
    prog: str = ""  # the messages' prefix (default "hpcdp prep NAME")
    description: str = ""
    epilog: str | None = None
    block_mib: bool = True  # whether --block-mib applies
    refusal: str = REFUSAL
    bad_input: tuple[type[BaseException], ...] = (PrepError, OSError, ImportError)

    @property
    def says(self) -> str:
        return self.prog or f"hpcdp prep {self.name}"


@dataclass
class Run:
    """One run of a recipe, as its `Recipe.write` sees it: what it may read and call."""

    recipe: Recipe
    inputs: Any
    out: str
    parts: Any  # `parts.Parts`, opened for this run
    comm: Any
    #: Collective: ``save(split)`` saves this rank's blocks of `split` as parts
    #: (``recipe.read_block``, those already saved skipped) and returns them (`mine`).
    save: Callable[[Split], range] = field(repr=False)
    #: Collective: ``write(split, mine[, tally])`` writes OUT/SPLIT.h5 from every rank's
    #: parts of `split` (``recipe.tally`` when `tally` is not given) and returns its path.
    write: Callable[..., str] = field(repr=False)
