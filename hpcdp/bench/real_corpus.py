"""JSON Lines corpora made of real files that no one in this project wrote: the source and
documentation of the running Python's standard library and installed packages.

A generated corpus has documents of one size distribution and few files; real corpora
have many shards and documents from a few bytes to megabytes, and a recipe whose memory
follows any of those shows it only on such input. Every machine that runs hpcdp has
these files, so the corpus needs no download: the folders come from `sysconfig` at run
time, the files (``.py``, ``.rst``, ``.txt``, ``.md`` that decode as UTF-8) are taken
in sorted order, each one document (``{"text": ..., "source": ...}``), and the list is
cycled when the corpus asked for is larger than what is installed. The same machine
gives the same files.

``python -m hpcdp.bench.real_corpus --out DIR --mib N [--shards K]`` writes
``DIR/part-NNNNN.jsonl``, K shards of about N/K MiB each.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import sysconfig
from collections.abc import Iterator

MIB = 1 << 20
SUFFIXES = (".py", ".rst", ".txt", ".md")
#: Shards by default: many files, as a real corpus has.
SHARDS = 18


def source_roots() -> list[str]:
    """The standard library's folder and the installed packages' folders, distinct."""
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("stdlib", "purelib", "platlib") if k in paths]
    return sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)})


def source_files(roots: list[str]) -> list[str]:
    """Every file under `roots` with one of `SUFFIXES`, sorted, none twice."""
    found: set[str] = set()
    for root in roots:
        for folder, subdirs, names in os.walk(root):
            subdirs.sort()
            found.update(os.path.join(folder, n) for n in names if n.endswith(SUFFIXES))
    return sorted(found)


def documents(paths: list[str]) -> Iterator[str]:
    """One JSON Lines record per non-empty UTF-8 file of `paths`, the list cycled forever
    (unreadable files skipped)."""
    if not paths:
        raise RuntimeError("no source files found under the Python installation")
    for path in itertools.cycle(paths):
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            yield json.dumps({"text": text, "source": os.path.basename(path)},
                             ensure_ascii=False)


def make_corpus(out: str, total_bytes: int, shards: int = SHARDS) -> list[str]:
    """``out/part-NNNNN.jsonl``: `shards` files of about ``total_bytes / shards`` each."""
    os.makedirs(out, exist_ok=True)
    per = -(-total_bytes // max(1, shards))
    docs = documents(source_files(source_roots()))
    paths = [os.path.join(out, f"part-{i:05d}.jsonl") for i in range(shards)]
    for path in paths:
        with open(path, "w", encoding="utf-8") as fh:
            written = 0
            while written < per:
                line = next(docs) + "\n"
                fh.write(line)
                written += len(line.encode())
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--mib", type=float, required=True, help="about this many MiB in all")
    p.add_argument("--shards", type=int, default=SHARDS)
    args = p.parse_args(argv)
    paths = make_corpus(args.out, int(args.mib * MIB), args.shards)
    print(f"wrote {len(paths)} files, {sum(map(os.path.getsize, paths)) / MIB:.1f} MiB, "
          f"under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
