"""`hpcdp checkpoint convert`: the knowing, one-time upgrade of a format-1 checkpoint.

Format 1 held NumPy arrays, loadable only by full unpickling, which runs any code a
file names. Converting is the one place that unpickles without restrictions, so it
runs only when a person asks for it, and only on a file and folder that pass the
same permission check as a resume (hpcdp.train.checkpoint_trust).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import torch

from hpcdp.cliargs import parse_args
from hpcdp.train.checkpoint_format import CheckpointError, decode, encode, split, write_atomic
from hpcdp.train.checkpoint_trust import Trust, read_verified


def convert_legacy(path: Path, out: Path, trust: Trust = Trust()) -> Path:
    """Rewrite a format-1 checkpoint in the current format, atomically, at `out`.

    This is the one place that unpickles without restrictions, so it runs only when a
    person asks for it (`hpcdp checkpoint convert`), and only on a file and folder
    that pass the same permission check as a resume.
    """
    data = read_verified(path, trust)
    version, payload = split(data, str(path))
    if version != 1:
        raise CheckpointError(f"{path}: already in the current format; nothing to convert")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means an unusable file
        raise CheckpointError(f"{path}: cannot be deserialized: {e}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: payload is not a state dict")
    write_atomic(out, encode(state))
    decode(out.read_bytes(), str(out))  # the result must load the safe way
    return out


def main(argv: list[str] | None = None) -> int:
    """`hpcdp checkpoint convert FILE`: the knowing, one-time upgrade of an old checkpoint."""
    p = argparse.ArgumentParser(
        prog="hpcdp checkpoint",
        description="Convert a checkpoint written before hpcdp loaded checkpoints without "
        "running code. Converting unpickles the old file fully, which runs any code it names: "
        "convert only files you wrote yourself and no one else could have changed.")
    sub = p.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert", help="rewrite an old (format 1) checkpoint, once")
    conv.add_argument("path", type=Path, help="the checkpoint file (step-N.pt)")
    conv.add_argument("--out", type=Path, help="write here instead of replacing the file")
    conv.add_argument("--allow-group-write", action="store_true",
                      help="accept a file or folder that your group can write")
    args = parse_args(p, argv)
    out = args.out or args.path
    try:
        convert_legacy(args.path, out, Trust(allow_group_write=args.allow_group_write))
    except CheckpointError as e:
        print(f"hpcdp checkpoint: error: {e}", file=sys.stderr)
        return 2
    print(f"converted {args.path} -> {out}: it now loads without running code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
