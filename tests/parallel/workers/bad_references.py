"""Each rank runs `hpcdp train` in this process once per command line (JSON, argv[1]) and
writes, per line, its exit status, its error text and whether Horovod was imported, to
argv[2]/rank-<rank>.json: a bad reference must fail on every rank, before Horovod starts."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

from hpcdp.train.command import main

results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    results.append({"code": code, "stderr": err.getvalue(), "horovod": "horovod" in sys.modules})
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
(Path(sys.argv[2]) / f"rank-{rank}.json").write_text(json.dumps(results))
