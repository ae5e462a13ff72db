"""`hpcdp bench prep --memory`: peak memory per rank of the text and image recipes at two
input sizes, to show that a rank's memory does not grow with the input.

The data is made here, never downloaded or committed: JSON Lines corpora of real files
(`hpcdp.bench.real_corpus`: the installed Python's own sources and docs, many shards of
documents from bytes to megabytes; ``--corpus synth`` for generated documents of one
size distribution, `hpcdp.data.synth.corpus`) and folders of photo-sized JPEGs
(`hpcdp.data.synth.photos`). Each recipe runs on `--np` ranks under mpirun,
every rank started through `measured`, which runs the recipe's script in-process and
then records the process's own high-water mark of resident memory (``VmHWM``, what
``/usr/bin/time -f %M`` reports) in one small JSON file per rank. The figure compared is
the largest rank's peak at the large input over that at the small one; the issue's bound
is 1.25.

``python -m hpcdp.bench.prep_memory --measured OUT_DIR SCRIPT ARGS...`` is that wrapper.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcdp.bench import common, real_corpus
from hpcdp.data.synth import corpus as corpus_synth
from hpcdp.data.synth import photos as photo_synth
from hpcdp.runtime.launcher import run_ranks

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
#: The bound of the issue: peak memory per rank at the large input / at the small one.
MAX_RATIO = 1.25
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def peak_kib() -> int:
    """This process's high-water mark of resident memory in KiB (``VmHWM``): unlike
    ``ru_maxrss`` it does not count the parent's pages before ``exec``."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/status has no VmHWM line")


def measured(out_dir: str, script: str, args: Sequence[str]) -> int:
    """Run `script` as ``__main__`` with `args`; record this rank's peak in
    ``out_dir/rss-RANK.json``; the script's exit status."""
    rank = next((int(os.environ[v]) for v in RANK_VARS if v in os.environ), 0)
    sys.argv = [script, *args]
    status: Any = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        status = exc.code
    with open(os.path.join(out_dir, f"rss-{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "peak_kib": peak_kib(), "status": status}, fh)
    return status if isinstance(status, int) else 1


def peaks(out_dir: str | os.PathLike[str]) -> list[int]:
    """Every rank's peak in KiB, in rank order."""
    found = [json.loads(p.read_text()) for p in Path(out_dir).glob("rss-*.json")]
    return [r["peak_kib"] for r in sorted(found, key=lambda r: r["rank"])]


def run_measured(recipe: str, args: Sequence[str], np: int, timeout: float,
                 work: Path) -> tuple[list[int], float, str]:
    """One recipe run on `np` ranks: each rank's peak in KiB, the wall seconds, and what the
    ranks printed."""
    out = Path(tempfile.mkdtemp(prefix="rss-", dir=work))
    argv = [sys.executable, "-m", "hpcdp.bench.prep_memory", "--measured", str(out),
            str(REPO / "datasets" / f"{recipe}.py"), *args]
    start = time.monotonic()
    run = run_ranks(argv, np=np, timeout=timeout, env={"PYTHONPATH": common.pythonpath()})
    if not run.ok:
        raise common.BenchError(f"{recipe} failed:\n{run.describe()[-4000:]}")
    return peaks(out), time.monotonic() - start, run.output


def cases(args: argparse.Namespace) -> list[tuple[str, str, list[str], int]]:
    """(case, recipe, options, input size) for each measured run; inputs made in `work`."""
    out: list[tuple[str, str, list[str], int]] = []
    block = ["--block-mib", str(args.block_mib)]
    for mib in args.text_mib:
        files = [str(text_dir(args, mib) / "*.jsonl")]
        out.append(("text bytes", "text", ["--files", *files, *block], mib))
        if args.bpe:
            out.append(("text bpe", "text", ["--files", *files, *block, "--tokenizer", "bpe",
                                             "--vocab-size", "8192", "--bpe-sample-bytes",
                                             str(args.bpe_sample_mib * MIB)], mib))
    for n in args.images:
        out.append(("images", "images", ["--root", str(args.work / f"images-{n}"), "--size",
                                         "256", "--val-fraction", "0.05", *block], n))
    return out


def text_dir(args: argparse.Namespace, mib: int) -> Path:
    """Where the corpus of `mib` MiB is kept (each kind of corpus in its own folder)."""
    return args.work / (f"text-{mib}" if args.corpus == "synth" else f"text-real-{mib}")


def make_text(args: argparse.Namespace, where: Path, mib: int) -> None:
    if args.corpus == "real":
        real_corpus.make_corpus(f"{where}.tmp", mib * MIB, shards=args.shards)
    else:  # files of at least a block each, so both sizes read whole blocks
        corpus_synth.make_corpus(f"{where}.tmp", mib * MIB,
                                 files=max(1, int(mib // args.block_mib)))


def make_inputs(args: argparse.Namespace) -> None:
    """The corpora and folders the cases read (kept in `work` between runs)."""
    for mib in args.text_mib:
        where = text_dir(args, mib)
        if not where.is_dir():
            make_text(args, where, mib)
            os.replace(f"{where}.tmp", where)  # a complete corpus or none
            print(f"made {mib} MiB of JSON Lines in {where}", flush=True)
    for n in args.images:
        where = args.work / f"images-{n}"
        if not where.is_dir():
            photo_synth.make_folder(f"{where}.tmp", n)
            os.replace(f"{where}.tmp", where)
            print(f"made {n} photo-sized JPEGs in {where}", flush=True)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case: the largest rank's peak at the smallest and largest input, their ratio."""
    out: dict[str, Any] = {}
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = sorted((r for r in rows if r["case"] == case), key=lambda r: r["input"])
        small, large = max(mine[0]["peak_kib"]), max(mine[-1]["peak_kib"])
        out[case] = {"small_mib": small / 1024, "large_mib": large / 1024,
                     "ratio": large / small, "ok": large / small <= MAX_RATIO}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--measured"]:
        return measured(argv[1], argv[2], argv[3:])
    p = argparse.ArgumentParser(prog="hpcdp bench prep --memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text-mib", type=lambda s: [int(v) for v in s.split(",") if v],
                   default=[100, 500], help="JSON Lines sizes in MiB (default 100,500)")
    p.add_argument("--images", type=lambda s: [int(v) for v in s.split(",") if v],
                   default=[2000, 8000], help="photo-sized JPEG counts (default 2000,8000)")
    p.add_argument("--corpus", choices=("real", "synth"), default="real",
                   help="text: shards of the installed Python's own files (default), or "
                        "generated documents")
    p.add_argument("--shards", type=int, default=real_corpus.SHARDS,
                   help="files of a real corpus, at every size (default 18)")
    p.add_argument("--bpe", action="store_true", help="also the text recipe with a BPE")
    p.add_argument("--bpe-sample-mib", type=int, default=32)
    p.add_argument("--block-mib", type=float, default=64)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--work", type=Path, default=Path("bench/prep-memory-data"),
                   help="where the generated inputs are kept (reused when there)")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", default="bench/results/prep_memory.json")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    make_inputs(args)
    rows = []
    for case, recipe, options, size in cases(args):
        with tempfile.TemporaryDirectory(dir=args.work) as out:
            ranks, seconds, _ = run_measured(recipe, [*options, "--out", out], args.np,
                                          args.timeout, args.work)
        rows.append({"case": case, "input": size, "peak_kib": ranks, "seconds": seconds})
        print(f"{case} at {size}: peak per rank {[round(k / 1024) for k in ranks]} MiB, "
              f"{seconds:.1f} s", flush=True)
    summary = summarize(rows)
    print(common.format_table(["case", "small input: MiB", "large input: MiB", "ratio"],
                              [[c, s["small_mib"], s["large_mib"], s["ratio"]]
                               for c, s in summary.items()]))
    payload = {"benchmark": "prep_memory", "config": {k: str(v) for k, v in vars(args).items()},
               "rows": rows, "summary": summary, "bound": MAX_RATIO}
    print(f"wrote {common.write_json(args.out, payload)}")
    return 0 if all(s["ok"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
