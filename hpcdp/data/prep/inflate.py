"""Reading gzip files: with ISA-L's inflate (the `isal` package) where it is installed, else
the standard library's zlib.

Inflating is the one step of preparing a gzipped log that cannot be shared between
ranks (a gzip stream cannot be entered midway), so its speed bounds how many ranks one
file keeps busy. ISA-L's inflate reads the same streams, multi-member files included,
about three times as fast as zlib on x86-64 (docs/data-criteo.md). Both raise the errors
in `ERRORS` for a damaged or truncated stream. `LIBRARY` names the one in use (`hpcdp
doctor`, `hpcdp bench prep`).
"""

from __future__ import annotations

import gzip
import zlib
from typing import Any

try:
    import isal
    from isal import igzip as _gzip
    from isal import isal_zlib

    LIBRARY = f"isal {isal.__version__} (ISA-L)"
    ERRORS: tuple[type[BaseException], ...] = (
        EOFError, gzip.BadGzipFile, zlib.error, isal_zlib.error)
except ImportError:  # a platform without its wheels: the same streams, slower
    _gzip = gzip  # type: ignore[no-redef]
    LIBRARY = f"zlib {zlib.ZLIB_RUNTIME_VERSION} (standard library)"
    ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


def open_gzip(path: str) -> Any:
    """`path` opened for reading its decompressed bytes (a binary file object)."""
    return _gzip.open(path, "rb")
