"""Runs commands on hostile inputs in one process, each under a time limit: the child of
test_hostile_images.py, under a memory cap (RLIMIT_AS) it sets itself once its imports are
done: the address space they took plus CAP_MIB. What the imports take depends on the torch
build (a CUDA build maps about 3 GB at import, a CPU build 0.65 GB), what a case may
add does not.

    python hostile_inputs_child.py CASES.json RESULTS.json SECONDS CAP_MIB

CASES.json: [{"name", "command": "prep" | "predict" | "generate", "argv": [...]}, ...].
Each command's main() runs with stdout and stderr as strict UTF-8 streams (a name that
cannot be printed fails the case, as it would fail a strict terminal), under
`signal.alarm` (a case that hangs, e.g. opening a FIFO, ends as "timeout"). RESULTS.json
gets per case: rc (the exit status, or None), out, err, error (an escaped exception),
seconds and the process's peak RSS so far in MiB.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import signal
import sys
import time


class Timeout(Exception):
    pass


def peak_mib() -> float:
    """This process's peak resident memory, in MiB: VmHWM, which exec starts afresh (the
    rusage maximum is carried over exec, so a child of a large pytest process would
    report the parent's size)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def address_space() -> int:
    """This process's address space now, in bytes (VmSize: what RLIMIT_AS limits)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmSize")


def _alarm(signum, frame):
    raise Timeout


def commands():
    from hpcdp.data.prep.images.recipe import main as prep
    from hpcdp.export.generate import main as generate
    from hpcdp.export.predict import main as predict

    return {"prep": prep, "predict": predict, "generate": generate}


def run(main, argv, seconds):
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
                for _ in range(2))
    rc, error = None, None
    start = time.perf_counter()
    signal.alarm(seconds)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    except SystemExit as e:
        rc = e.code
    except Timeout:
        error = "timeout"
    except BaseException as e:  # noqa: BLE001 - the case's outcome, whatever it is
        error = f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
    texts = []
    for stream in (out, err):
        with contextlib.suppress(Exception):
            stream.flush()
        texts.append(stream.buffer.getvalue().decode("utf-8", "backslashreplace"))
    return {"rc": rc, "out": texts[0], "err": texts[1], "error": error,
            "seconds": time.perf_counter() - start,
            "peak_mib": peak_mib()}


def main() -> None:
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    seconds, cap_mib = int(sys.argv[3]), int(sys.argv[4])
    signal.signal(signal.SIGALRM, _alarm)
    mains = commands()
    cap = address_space() + (cap_mib << 20)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    results = {"imported_peak_mib": peak_mib(), "cap_mib": cap >> 20}
    for case in cases:
        results[case["name"]] = run(mains[case["command"]], case["argv"], seconds)
        with open(sys.argv[2], "w") as f:  # written as it goes: a killed child leaves some
            json.dump(results, f)


if __name__ == "__main__":
    main()
