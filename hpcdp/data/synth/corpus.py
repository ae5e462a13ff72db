"""JSON Lines corpora of a given size for the text recipe's tests and benchmarks.

Web text cannot be committed or downloaded here, so scale data is generated: documents
of word-like tokens drawn from a Zipf-like vocabulary (so a BPE has merges to learn),
a few hundred to a few thousand bytes each (about a web page's text), some beyond
ASCII, one JSON object a line (``{"text": ...}``). Words are cut from a pool built
once, so gigabytes are written at disk speed. The same seed gives the same files.

``python -m hpcdp.data.synth.corpus --out DIR --mib N [--files K]`` writes
``DIR/part-NNNNN.jsonl``, K files of about N/K MiB each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

MIB = 1 << 20
#: Distinct words of the vocabulary, and the words in the pool documents are cut from.
WORDS = 20_000
POOL_WORDS = 1 << 20
LETTERS = "etaoinshrdlucmfwypvbgkqjxz" + "éüßøñ"


def word_pool(rng: np.random.Generator, n_words: int = POOL_WORDS) -> str:
    """A text of `n_words` Zipf-distributed words, with sentence ends."""
    lengths = rng.integers(1, 10, WORDS)
    weights = 1.0 / np.arange(1, len(LETTERS) + 1)
    letters = rng.choice(list(LETTERS), int(lengths.sum()), p=weights / weights.sum())
    cuts = np.cumsum(lengths)[:-1]
    words = ["".join(w) for w in np.split(letters, cuts)]
    ranks = np.minimum(rng.zipf(1.2, n_words), WORDS) - 1
    text = [words[r] + (". " if i % 17 == 16 else " ") for i, r in enumerate(ranks)]
    return "".join(text)


def documents(total_bytes: int, seed: int):
    """Documents until about `total_bytes` of JSON Lines are made."""
    rng = np.random.Generator(np.random.PCG64(seed))
    pool = word_pool(rng, int(np.clip(total_bytes // 6, 4096, POOL_WORDS)))
    made = 0
    while made < total_bytes:
        n = int(min(20_000, len(pool) // 2, max(50, rng.lognormal(7.5, 0.9))))
        at = int(rng.integers(0, len(pool) - n))
        line = json.dumps({"text": pool[at : at + n].strip()}, ensure_ascii=False)
        made += len(line.encode()) + 1
        yield line


def make_corpus(out: str, total_bytes: int, files: int = 4, seed: int = 0) -> list[str]:
    """``out/part-NNNNN.jsonl`` holding about `total_bytes` in all; their paths."""
    os.makedirs(out, exist_ok=True)
    per = -(-total_bytes // max(1, files))
    docs = documents(total_bytes, seed)
    paths: list[str] = []
    line = next(docs, None)
    while line is not None:
        paths.append(os.path.join(out, f"part-{len(paths):05d}.jsonl"))
        with open(paths[-1], "w", encoding="utf-8") as fh:
            written = 0
            while line is not None and written < per:
                fh.write(line + "\n")
                written += len(line.encode()) + 1
                line = next(docs, None)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--mib", type=float, required=True, help="about this many MiB in all")
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    paths = make_corpus(args.out, int(args.mib * MIB), args.files, args.seed)
    print(f"wrote {len(paths)} files, {sum(map(os.path.getsize, paths)) / MIB:.1f} MiB, "
          f"under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
