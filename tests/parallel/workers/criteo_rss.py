"""The Criteo recipe on this rank, then this rank's peak resident memory: ``maxrss_kib N``."""

from __future__ import annotations

import resource
import sys

from hpcdp.data.prep.clicks.criteo_recipe import main

if __name__ == "__main__":
    status = main(sys.argv[1:])
    print(f"maxrss_kib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)
    sys.exit(status)
