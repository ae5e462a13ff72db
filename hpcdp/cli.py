"""The `hpcdp` command: one entry point that hands each subcommand to its module.

Each subcommand's module owns its own argument parsing (`main(argv) -> int`), so
that `hpcdp train ...` and `python -m hpcdp.train ...` accept the same options.
Modules are imported only when their subcommand runs: `hpcdp slurm render` on a
login node must not need Horovod or PyTorch to import.
"""

from __future__ import annotations

import importlib
import sys

from hpcdp import __version__
from hpcdp.runtime.crash import report_crashes

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "prep": ("hpcdp.data.prep.cli",
             "prepare a dataset as chunked HDF5 (serial or MPI-parallel): arrays, digits, "
             "cifar, synthetic, markov, clicks, images, text, criteo"),
    "train": ("hpcdp.train", "train a model data-parallel with Horovod"),
    "slurm": ("hpcdp.cluster.cli",
              "render or submit a Slurm batch script; sweeps, chains, job status"),
    "plan": ("hpcdp.plan.cli", "how many nodes: step time, samples/s and efficiency predicted "
             "for 1..N nodes"),
    "bench": ("hpcdp.bench", "run a benchmark (allreduce, fusion, reader, train)"),
    "doctor": ("hpcdp.doctor", "check the stack: Horovod build, MPI, parallel HDF5, GPUs, Slurm"),
    "eval": ("hpcdp.train.eval_command",
             "score a checkpoint on a dataset (1 or N ranks, like training); eval.json"),
    "export": ("hpcdp.export.command",
               "write a trained model as model.safetensors + config.json (+ tokenizer)"),
    "generate": ("hpcdp.export.generate", "sample text or token ids from a trained GPT"),
    "predict": ("hpcdp.export.predict", "top classes of image files under an exported model"),
    "report": ("hpcdp.train.report_command",
               "draw where each rank's time went (PNG) from a run's metrics.jsonl"),
    "checkpoint": ("hpcdp.train.checkpoint_convert",
                   "convert a checkpoint from before safe loading, once"),
}


def usage() -> str:
    lines = ["usage: hpcdp <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run 'hpcdp <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name in ("-V", "--version"):
        print(__version__)
        return 0
    if name not in SUBCOMMANDS:
        print(f"hpcdp: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    report_crashes()
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
