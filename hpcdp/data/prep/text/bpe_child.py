"""The BPE trainer's own process (`tokenizer.train_bpe_apart`): documents as JSON strings,
one a line, on stdin; the trained tokenizer.json on stdout. A bad option (the vocabulary
too small) is its message on stderr and exit status 2.

    python -m hpcdp.data.prep.text.bpe_child VOCAB_SIZE EOD_TOKEN < sample.jsonl
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence

from hpcdp.data.prep.text import tokenizer as tz


def documents(lines: Iterator[bytes]) -> Iterator[str]:
    for line in lines:
        yield json.loads(line)


def main(argv: Sequence[str] | None = None) -> int:
    vocab_size, eod_token = (sys.argv[1:] if argv is None else argv)
    try:
        tok = tz.train_bpe(documents(iter(sys.stdin.buffer)), int(vocab_size), eod_token)
    except tz.TokenizerError as exc:
        print(exc, file=sys.stderr)
        return 2
    assert tok.json is not None
    sys.stdout.write(tok.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
