"""`hpcdp bench prep --rates`: how fast each recipe prepares, per core, on 1 and 2 ranks, and
what that makes of the Criteo Terabyte release on P cores.

Generated inputs, never downloaded: Criteo-format logs with Terabyte-like
cardinalities (plain and gzipped), a JSON Lines corpus, a folder of photo-sized
JPEGs. Each case runs on 1 and on 2 ranks under mpirun, alternating, every rank
started through `prep_memory.measured` (its peak resident memory). The time is the
recipe's own (its "N s on P rank(s)" line: from its first barrier to the renamed
files); the items are read from the written files (rows, tokens, images). Per core
is the rate over the ranks (2 ranks on 2 cores).

The projection (`project`) for the Criteo Terabyte release (about 4.37 billion rows
in 24 gzipped day files): a core-second per row is parsing and writing (the plain
log's rate per core on 2 ranks) plus inflating (one core's rate through the
`Inflater`, measured here alone), so the work takes rows x (1/parse + 1/inflate) / P
seconds; and a gzip file is inflated by one rank, so no run is shorter than a day
file's rows over the inflate rate (with more files than cores, several in turn). The
projection is the larger of the two, and assumes the file system keeps up: the
rows are written twice (parts, then the files).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdp.bench import common, prep_memory
from hpcdp.cliargs import parse_args

MIB = 1 << 20
#: The Criteo Terabyte release: about 4.37 billion rows in 24 day files, gzipped.
TERABYTE_ROWS = 4_370_000_000
TERABYTE_FILES = 24
#: Core counts the projection is shown for; the bound of 30 minutes at 128 cores.
PROJECT_CORES = (128, 512, 2048)
BOUND_CORES, BOUND_SECONDS = 128, 30 * 60


@dataclass(frozen=True)
class Case:
    name: str
    recipe: str  # datasets/NAME.py
    args: tuple[str, ...]
    unit: str  # what the items are: rows, tokens, images
    inputs: tuple[str, ...]  # the input files, for their bytes


def project(rows: float, files: int, cores: int, parse_rate: float, inflate_rate: float
            ) -> dict[str, float]:
    """Seconds to prepare `rows` in `files` gzip files on `cores` cores, from per-core rates
    (rows/s) of parsing-and-writing and of inflating: the work over the cores, or a file's
    inflating (several files in turn on a rank when there are fewer cores), the larger."""
    work = rows * (1.0 / parse_rate + 1.0 / inflate_rate) / cores
    inflating = math.ceil(files / cores) * (rows / files) / inflate_rate
    return {"cores": cores, "work_seconds": work, "inflate_seconds": inflating,
            "seconds": max(work, inflating)}


def inflate_rate(path: str) -> dict[str, float]:
    """One core's rate through the `Inflater` (lines cut, chunks counted, not written)."""
    from hpcdp.data.prep import inflate
    from hpcdp.data.prep.clicks.criteo_blocks import Inflater

    start = time.perf_counter()
    inflater = Inflater(path, 64 * MIB)
    plain = 0
    while (chunk := inflater.next_chunk(None)) is not None:
        plain += chunk[1]
    seconds = time.perf_counter() - start
    return {"rows": inflater.read_lines, "seconds": seconds, "plain_bytes": plain,
            "rows_per_s": inflater.read_lines / seconds, "library": inflate.LIBRARY}


def items(out: Path, unit: str) -> int:
    """Rows, tokens or images in the written files."""
    import h5py

    total = 0
    for path in sorted(out.glob("*.h5")):
        with h5py.File(path, "r") as f:
            total += int(f.attrs["num_tokens" if unit == "tokens" else "num_samples"])
    return total


def run_case(case: Case, np: int, work: Path, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rates-", dir=work) as tmp:
        out = Path(tmp) / "out"
        peaks, wall, printed = prep_memory.run_measured(
            case.recipe, [*case.args, "--out", str(out)], np, timeout, Path(tmp))
        seconds = float(re.findall(r"([0-9.]+) s on \d+ rank\(s\)", printed)[-1])
        count = items(out, case.unit)
        tokenizer = out / "tokenizer.json"
        made = hashlib.sha256(tokenizer.read_bytes()).hexdigest()[:16] \
            if tokenizer.exists() else None
    nbytes = sum(os.path.getsize(p) for p in case.inputs)
    return {"case": case.name, "ranks": np, "seconds": seconds, "items": count,
            "unit": case.unit, "input_bytes": nbytes, "wall_seconds": wall,
            "per_core": count / seconds / np, "mb_per_s_per_core": nbytes / 1e6 / seconds / np,
            "peak_mib_per_rank": [k / 1024 for k in peaks], "tokenizer_sha256": made}


def make_inputs(args: argparse.Namespace) -> dict[str, list[str]]:
    """The generated inputs (kept in --work between runs): name -> files."""
    from hpcdp.data.synth import corpus as corpus_synth
    from hpcdp.data.synth import criteo_logs as criteo_synth
    from hpcdp.data.synth import photos as photo_synth

    work: Path = args.work
    logs = work / f"criteo-{args.rows}"
    if not (logs / "day_0.txt.gz").exists():
        spec = criteo_synth.ScaleSpec(seed=0)
        tmp = Path(f"{logs}.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        criteo_synth.write_scale(spec, "train", args.rows, [str(tmp / "day_0.txt")])
        criteo_synth.write_scale(spec, "val", 20_000, [str(tmp / "val.txt")])
        with open(tmp / "day_0.txt", "rb") as src, \
                gzip.open(tmp / "day_0.txt.gz", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 4 * MIB)
        os.replace(tmp, logs)
        print(f"made {args.rows} Criteo rows in {logs}", flush=True)
    text = work / f"text-{args.text_mib}"
    if not text.is_dir():
        corpus_synth.make_corpus(f"{text}.tmp", args.text_mib * MIB, files=4)
        os.replace(f"{text}.tmp", text)
        print(f"made {args.text_mib} MiB of JSON Lines in {text}", flush=True)
    images = work / f"images-{args.images}"
    if not images.is_dir():
        photo_synth.make_folder(f"{images}.tmp", args.images)
        os.replace(f"{images}.tmp", images)
        print(f"made {args.images} photo-sized JPEGs in {images}", flush=True)
    return {"plain": [str(logs / "day_0.txt")], "gzip": [str(logs / "day_0.txt.gz")],
            "val": [str(logs / "val.txt")], "text": sorted(str(p) for p in text.glob("*.jsonl")),
            "images": [str(p) for p in images.rglob("*.jpg")], "images_root": [str(images)]}


def cases(args: argparse.Namespace, files: dict[str, list[str]]) -> list[Case]:
    out = []
    for kind in ("plain", "gzip"):
        for rule, opts in (("buckets", ("--buckets", "1000000")),
                           ("min-count", ("--min-count", "3"))):
            out.append(Case(f"criteo {rule}, {kind}", "criteo",
                            ("--files", *files[kind], "--val-files", *files["val"], *opts),
                            "rows", tuple(files[kind] + files["val"])))
    text = ("--files", *files["text"])
    out.append(Case("text, bytes", "text", text, "tokens", tuple(files["text"])))
    out.append(Case("text, BPE", "text", (*text, "--tokenizer", "bpe", "--vocab-size", "8192",
                                          "--bpe-sample-bytes", str(args.bpe_sample_mib * MIB)),
                    "tokens", tuple(files["text"])))
    out.append(Case("images", "images", ("--root", *files["images_root"], "--size", "256",
                                         "--val-fraction", "0.05"), "images",
                    tuple(files["images"])))
    return [c for c in out if not args.only or any(o in c.name for o in args.only)]


def table(runs: list[dict[str, Any]]) -> str:
    rows = []
    for case in dict.fromkeys(r["case"] for r in runs):
        for np in (1, 2):
            mine = [r for r in runs if r["case"] == case and r["ranks"] == np]
            if not mine:
                continue
            seconds = common.median(r["seconds"] for r in mine)
            best = min(mine, key=lambda r: abs(r["seconds"] - seconds))
            rows.append([case, np, seconds, f"{best['per_core']:,.0f} {best['unit']}/s",
                         best["mb_per_s_per_core"], max(best["peak_mib_per_rank"])])
    return common.format_table(["case", "ranks", "seconds (median)", "per core",
                                "input MB/s per core", "peak MiB per rank"], rows)


def projection(runs: list[dict[str, Any]], inflated: dict[str, float]) -> list[dict[str, Any]]:
    """Per id rule: the Terabyte projection at `PROJECT_CORES`, from the plain log's rate per
    core on 2 ranks and one core's inflate rate; and the same model for the measured gzip
    run on 2 ranks beside its measured time."""
    out = []
    for rule in ("buckets", "min-count"):
        plain = [r for r in runs if r["case"] == f"criteo {rule}, plain" and r["ranks"] == 2]
        gz = [r for r in runs if r["case"] == f"criteo {rule}, gzip" and r["ranks"] == 2]
        if not plain:
            continue
        parse = common.median(r["per_core"] for r in plain)
        cores = [project(TERABYTE_ROWS, TERABYTE_FILES, p, parse, inflated["rows_per_s"])
                 for p in PROJECT_CORES]
        check = None
        if gz:
            model = project(gz[0]["items"], 1, 2, parse, inflated["rows_per_s"])
            check = {"model_seconds": model["seconds"],
                     "measured_seconds": common.median(r["seconds"] for r in gz)}
        out.append({"rule": rule, "parse_rows_per_s_per_core": parse,
                    "inflate_rows_per_s": inflated["rows_per_s"], "cores": cores,
                    "gzip_2_ranks": check})
    return out


def show_projection(found: list[dict[str, Any]]) -> None:
    for p in found:
        print(f"\nCriteo Terabyte ({TERABYTE_ROWS / 1e9:.2f}B rows, {TERABYTE_FILES} gzip "
              f"files), {p['rule']}: parse+write {p['parse_rows_per_s_per_core']:,.0f} rows/s "
              f"per core, inflate {p['inflate_rows_per_s']:,.0f} rows/s on one core")
        for c in p["cores"]:
            print(f"  {c['cores']:>5} cores: work {TERABYTE_ROWS:.3g} x (1/"
                  f"{p['parse_rows_per_s_per_core']:,.0f} + 1/{p['inflate_rows_per_s']:,.0f})"
                  f" / {c['cores']} = {c['work_seconds'] / 60:.1f} min; one day file's "
                  f"inflating {c['inflate_seconds'] / 60:.1f} min -> {c['seconds'] / 60:.1f} min")
        if p["gzip_2_ranks"]:
            g = p["gzip_2_ranks"]
            print(f"  the model for the measured gzip log on 2 ranks: {g['model_seconds']:.1f} s;"
                  f" measured {g['measured_seconds']:.1f} s")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hpcdp bench prep --rates", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000, help="Criteo training rows")
    p.add_argument("--text-mib", type=int, default=200, help="JSON Lines corpus, MiB")
    p.add_argument("--bpe-sample-mib", type=int, default=64)
    p.add_argument("--images", type=int, default=2000, help="photo-sized JPEGs")
    p.add_argument("--rounds", type=int, default=1, help="launches per case and rank count")
    p.add_argument("--only", nargs="*", default=[], help="cases whose name holds one of these")
    p.add_argument("--work", type=Path, default=Path("bench/prep-rates-data"),
                   help="where the generated inputs are kept (reused when there)")
    p.add_argument("--timeout", type=float, default=3600.0, help="bound on each launch, s")
    p.add_argument("--out", default="bench/results/prep_rates.json")
    args = parse_args(p, list(sys.argv[1:] if argv is None else argv))
    args.work.mkdir(parents=True, exist_ok=True)
    files = make_inputs(args)
    runs = []
    for case in cases(args, files):
        for k in range(args.rounds):
            for np in (1, 2) if k % 2 == 0 else (2, 1):  # alternating, on a noisy machine
                runs.append(run_case(case, np, args.work, args.timeout))
                r = runs[-1]
                print(f"{case.name}, {np} rank(s): {r['seconds']:.2f} s, {r['items']} "
                      f"{r['unit']}, peak {max(r['peak_mib_per_rank']):.0f} MiB", flush=True)
    inflated = inflate_rate(files["gzip"][0]) if any("gzip" in r["case"] for r in runs) \
        else None
    print()
    print(table(runs))
    for case in dict.fromkeys(r["case"] for r in runs if r["tokenizer_sha256"]):
        made = {r["ranks"]: r["tokenizer_sha256"] for r in runs if r["case"] == case}
        print(f"{case}: tokenizer.json sha256 {made}: "
              f"{'the same' if len(set(made.values())) == 1 else 'DIFFERENT'} on 1 and 2 ranks")
    found = projection(runs, inflated) if inflated else []
    if inflated:
        print(f"\ninflating alone ({inflated['library']}): {inflated['rows']} rows in "
              f"{inflated['seconds']:.2f} s on one core")
        show_projection(found)
    payload = {"benchmark": "prep_rates",
               "config": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
               "inflate": inflated, "projection": found}
    print(f"wrote {common.write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
