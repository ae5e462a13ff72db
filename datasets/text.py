"""Recipe: text, JSON Lines or Parquet corpora -> OUT/train.h5, OUT/val.h5 (token streams).

Text: one document per file, or per line with --lines; JSON Lines (.jsonl, .jsonl.gz,
.json.gz) and Parquet: one per record, the string field --field (default text).
Tokenizers: byte-level (default), --tokenizer bpe (trained here on the corpus), or
--tokenizer PATH/tokenizer.json. See docs/data-text.md.
Example: mpirun -np 2 python datasets/text.py --out data/text --files 'corpus/**/*.txt'

Runs on one process or under mpirun / srun --mpi=pmix. Options: `python datasets/text.py --help`.
"""

import sys

from hpcdp.data.prep.cli import main

if __name__ == "__main__":
    sys.exit(main(["text", *sys.argv[1:]]))
