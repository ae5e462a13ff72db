"""`hpcdp plan`: how many nodes? Predicted step time, samples/s and efficiency for 1..N nodes.

  hpcdp plan --config CFG [key=value ...] --allreduce intra.json [--allreduce-inter inter.json]
  hpcdp plan --run RUN_DIR --site NAME            # a finished 1-rank run, the site's network
  hpcdp plan --check --run ONE_RANK_DIR --against RUN_DIR:NODES ... --allreduce intra.json
  hpcdp plan --model resnet50 --compute-ms 100 --global-batch 1024 --site NAME   # stated

After the node counts, the advice: each node count's efficiency with no
compression, bf16, PowerSGD (--powersgd-rank) and accumulation (--accumulate),
and the cheapest in accuracy that meets --target.

The measurement is one rank training at the per-rank batch of one node
(--global-batch / --ranks-per-node); the network is fitted from `hpcdp bench
allreduce` JSON or read from the site profile's [network] table (docs/planning.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcdp.cliargs import parse_args
from hpcdp.plan import advise, model, network
from hpcdp.plan.measure import Measured, MeasureError, cores, measure, read_run, step_of
from hpcdp.plan.stated import Shape, model_gradients, stated_step

# Shared with the table's notes: where each input came from.
Sources = list[str]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcdp plan", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    _measurement_options(p)
    _network_options(p)
    _job_options(p)
    _model_options(p)
    p.add_argument("--check", action="store_true",
                   help="compare predictions with measured runs (--against)")
    p.add_argument("--against", action="append", default=[], metavar="RUN_DIR[:NODES]",
                   help="a finished run to compare with (--check; NODES default 1)")
    p.add_argument("--label", default="", help="--check: the row label (e.g. the model)")
    p.add_argument("--json", type=Path, help="also write the predictions here")
    return p


def _measurement_options(p: argparse.ArgumentParser) -> None:
    """Where one node's step comes from, and the config overrides for measuring it."""
    src = p.add_argument_group("the 1-node measurement (one of)")
    src.add_argument("--config", help="training config: a short 1-rank run measures it")
    src.add_argument("--run", type=Path, help="a finished 1-rank run folder to read instead")
    src.add_argument("--run-half", type=Path,
                     help="with --run: the same at half the batch (the compute's fixed part)")
    src.add_argument("--model", help="a stated step instead: one of hpcdp's image models "
                                     "(its gradient layout built here), with --compute-ms")
    src.add_argument("--compute-ms", type=float,
                     help="with --model: one rank's step, measured elsewhere (e.g. its GPU)")
    src.add_argument("--measured-batch", type=int, default=32,
                     help="with --model: the samples per rank --compute-ms was measured at")
    src.add_argument("--sample-shape", default="3,224,224", help="with --model: C,H,W")
    src.add_argument("--classes", type=int, default=1000, help="with --model: classes")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value",
                   help="training config overrides for the measurement")


def _network_options(p: argparse.ArgumentParser) -> None:
    """The all-reduce fits and the site that give the network's alpha and beta."""
    net = p.add_argument_group("the network model")
    net.add_argument("--allreduce", type=Path,
                     help="hpcdp bench allreduce JSON from within one node (the intra level; "
                          "also the inter level unless --allreduce-inter or the site says)")
    net.add_argument("--allreduce-inter", type=Path,
                     help="hpcdp bench allreduce JSON with one rank on each of 2+ nodes")
    net.add_argument("--column", help="the benchmark column to fit (default: hvd_, the "
                                      "in-place all-reduce training makes)")
    net.add_argument("--site", help="site profile whose [network] table gives alpha and beta "
                                    "(a name or a .toml file)")
    net.add_argument("--flat", action="store_true",
                     help="one flat ring over all ranks instead of within-node then across")


def _job_options(p: argparse.ArgumentParser) -> None:
    """The job to plan, and the changes the advice predicts."""
    lay = p.add_argument_group("the job")
    lay.add_argument("--global-batch", type=int,
                     help="samples per optimizer step, fixed for every node count (default: "
                          "the config's data.global_batch_size)")
    lay.add_argument("--ranks-per-node", type=int, help="ranks (GPUs) per node (default: the "
                                                        "site's, else 1)")
    lay.add_argument("--max-nodes", type=int, default=8)
    lay.add_argument("--target", type=float, default=0.8, help="scaling efficiency to meet")
    adv = p.add_argument_group("the advice (what to change when the network sets the pace)")
    adv.add_argument("--powersgd-rank", type=int, default=4,
                     help="the PowerSGD rank to predict (horovod.powersgd_rank)")
    adv.add_argument("--accumulate", type=int, default=4,
                     help="micro-batches per all-reduce to predict "
                          "(horovod.backward_passes_per_step)")


def _model_options(p: argparse.ArgumentParser) -> None:
    """The scaling model's assumptions, and how the measurement runs."""
    mod = p.add_argument_group("model assumptions")
    mod.add_argument("--backward-share", type=float, default=2 / 3,
                     help="backward's share of the compute, the part all-reduces hide behind")
    mod.add_argument("--no-overlap", action="store_true",
                     help="all-reduces wait for the end of backward")
    mod.add_argument("--fusion-bytes", type=int,
                     help="group gradients in buffers of this size when the run recorded none")
    run = p.add_argument_group("running the measurement")
    run.add_argument("--steps", type=int, default=30, help="timed steps")
    run.add_argument("--warmup", type=int, default=10, help="steps left out first")
    run.add_argument("--threads", type=int,
                     help="threads of the measuring rank (default on CPUs: cores / ranks per "
                          "node, what each rank of the job gets)")
    run.add_argument("--timeout", type=float, default=600.0)


def network_model(args: argparse.Namespace, sources: Sources) -> tuple[model.Network, int | None]:
    """The Network and the site's ranks per node, from the fits and the site profile."""
    intra = inter = None
    site_rpn, hierarchical = None, not args.flat
    if args.site:
        from hpcdp.cluster import sites

        chosen = sites.choose(args.site, os.environ)
        if chosen is None:
            raise network.NetworkError(f"--site {args.site}: no profile")
        intra, inter, other = network.from_site(sites.load(chosen[1]), f"site {chosen[0]}")
        site_rpn = other.get("ranks_per_node")
        hierarchical = other.get("hierarchical", True) and not args.flat
        sources.append(f"network: site profile {chosen[1]} [network]")
    for path, level in ((args.allreduce, "intra"), (args.allreduce_inter, "inter")):
        if path is None:
            continue
        fit = network.fit_allreduce(_load(path), args.column, where=str(path))
        sources.append(
            f"network {level}: fitted from {path} ({fit.config}/{fit.column}, {fit.ranks} "
            f"ranks, sizes {fit.sizes[0]}-{fit.sizes[-1]} B): alpha "
            f"{fit.link.alpha_s * 1e6:.1f} us, {fit.link.gbytes_per_s:.2f} GB/s "
            f"(worst misfit {fit.worst_error:.0%} at a measured size)")
        if level == "intra":
            intra = fit.link
        else:
            inter = fit.link
    if (intra is None) != (inter is None):
        sources.append("network: one level known, used for both (within and across nodes)")
    return network.network(intra, inter, hierarchical), site_rpn


def _load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise network.NetworkError(f"{path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise network.NetworkError(f"{path}: not valid JSON: {e}") from None


def measured(args: argparse.Namespace, global_batch: int | None, rpn: int,
             sources: Sources) -> tuple[Measured, Measured | None]:
    """The 1-rank measurement, and the same at half the batch where there is one: read
    back, or run now at one node's per-rank batch and half of it."""
    if args.run is not None:
        m = read_run(args.run, args.warmup)
        half = read_run(args.run_half, args.warmup) if args.run_half else None
        sources.append(f"measurement: {args.run} (1 rank, batch {m.global_batch}, steady "
                       f"state after step {args.warmup})"
                       + (f" and {args.run_half}" if half else ""))
        return m, half
    if global_batch is None:
        global_batch = config_global_batch(args.config, args.overrides)
    if global_batch % rpn:
        raise MeasureError(f"global batch {global_batch} does not divide over {rpn} ranks "
                           "per node")
    threads = args.threads or max(1, cores() // rpn)
    batch = global_batch // rpn
    m = measure(args.config, args.overrides, batch, threads, args.steps, args.warmup,
                args.timeout)
    half = (measure(args.config, args.overrides, batch // 2, threads, args.steps,
                    args.warmup, args.timeout) if batch % 2 == 0 else None)
    sources.append(f"measurement: {args.config}, 1 rank, batch {batch}"
                   + (f" and {batch // 2}" if half else "") + f", {threads} thread(s), "
                   f"{args.steps} steps after {args.warmup}")
    return m, half


def config_global_batch(config: str, overrides: Sequence[str]) -> int:
    """data.global_batch_size of the config with its overrides; refused when not set."""
    from hpcdp import config as cfgmod

    cfg = cfgmod.build(config, list(overrides))
    if not cfg.data.global_batch_size:
        raise MeasureError(
            f"{config}: data.global_batch_size is not set, so data.batch_size="
            f"{cfg.data.batch_size} is per rank and the global batch (with it the peak "
            "learning rate and the dynamics) would change with the node count; set "
            "data.global_batch_size or pass --global-batch")
    return int(cfg.data.global_batch_size)


def format_predictions(preds: Sequence[model.Prediction], target: float) -> str:
    from hpcdp.bench.common import format_table

    rows = [[p.nodes, p.ranks, p.step_s * 1e3, p.data_s * 1e3, p.compute_s * 1e3,
             p.comm_s * 1e3, p.exposed_s * 1e3, p.samples_per_s,
             f"{p.efficiency:.0%}" + ("" if p.fits_batch else " (batch does not divide)")]
            for p in preds]
    headers = ["nodes", "ranks", "step ms", "data ms", "compute ms", "all-reduce ms",
               "exposed ms", "samples/s", "efficiency"]
    lines = [format_table(headers, rows)]
    top = model.nodes_for(preds, target)
    span = model.suggested_range(preds, target)
    if top is None:
        lines.append(f"no node count reaches {target:.0%} efficiency beyond 1 node")
    else:
        lines.append(f"{target:.0%} efficiency or better up to {top} node(s)")
    if span is not None and span[0] < span[1]:
        lines.append(f"suggested: hpcdp slurm submit --nodes {span[0]}-{span[1]} ... "
                     "(the global batch fixed: data.global_batch_size)")
    elif span is not None:
        lines.append(f"suggested: hpcdp slurm submit --nodes {span[0]} ...")
    return "\n".join(lines)


def check_rows(label: str, step: model.Step, net: model.Network,
               against: Sequence[tuple[Measured, int]], reference: Measured) -> list[list[Any]]:
    """Predicted against measured step time for each run (pure given the Measured)."""
    rows: list[list[Any]] = [[label, 1, 1, reference.global_batch, f"{reference.step_ms:.2f}",
                              f"{reference.step_ms:.2f}", "0%", "(the measurement)"]]
    for m, nodes in against:
        if m.ranks % nodes:
            raise MeasureError(f"{m.run_dir}: {m.ranks} ranks do not split over {nodes} nodes")
        total, *_ , exposed = model.step_at(step, net, nodes, m.ranks // nodes, m.global_batch)
        err = total * 1e3 / m.step_ms - 1
        rows.append([label, m.ranks, nodes, m.global_batch, f"{total * 1e3:.2f}",
                     f"{m.step_ms:.2f}",
                     f"{err:+.0%}", f"split: data {m.data_ms:.1f}, compute {m.compute_ms:.1f}, "
                     f"comm {m.comm_ms:.1f} ms; predicted exposed {exposed * 1e3:.1f} ms"])
    return rows


def refused(args: argparse.Namespace) -> str | None:
    """Why the options cannot go together, before anything is measured; None when they can."""
    if sum(x is not None for x in (args.config, args.run, args.model)) != 1:
        return ("give --config CFG (measure now), --run DIR (read a 1-rank run) or --model "
                "NAME --compute-ms MS (a stated step)")
    if (args.model is None) != (args.compute_ms is None):
        return "--model and --compute-ms go together (a stated step)"
    if args.model and args.check:
        return "--check compares measured runs: give --run, not --model"
    rpn = args.ranks_per_node
    if not 0 < args.target <= 1 or args.max_nodes < 1 or (rpn is not None and rpn < 1):
        return "--target must be within (0, 1], --max-nodes and --ranks-per-node positive"
    if args.powersgd_rank < 1 or args.accumulate < 2:
        return "--powersgd-rank must be positive and --accumulate at least 2"
    if args.check and not args.against:
        return "--check needs --against RUN_DIR[:NODES]"
    return None


def stated(args: argparse.Namespace, sources: Sources) -> tuple[model.Step, list[Shape], int]:
    """The Step, gradient shapes and global batch of --model with --compute-ms."""
    from hpcdp.runtime.hvd_settings import HOROVOD_FUSION_BYTES

    sample = tuple(int(v) for v in args.sample_shape.split(","))
    shapes = model_gradients(args.model, sample, args.classes)
    fusion = args.fusion_bytes or HOROVOD_FUSION_BYTES
    step = stated_step(shapes, args.compute_ms, args.measured_batch, fusion,
                       args.backward_share, not args.no_overlap)
    sources.append(f"stated step: {args.model} ({len(shapes)} gradients, "
                   f"{step.gradient_bytes / 1e6:.1f} MB), compute {args.compute_ms} ms at "
                   f"{args.measured_batch} samples per rank, data 0; fusion buffers of "
                   f"{fusion / 2**20:.0f} MiB")
    global_batch = args.global_batch or args.measured_batch
    return step, shapes, global_batch


def planned(args: argparse.Namespace, rpn: int, sources: Sources
            ) -> tuple[model.Step, list[Shape] | None, int, Measured | None]:
    """The Step, the gradient shapes (None: the run recorded none), the global batch, and the
    measurement it came from (None for a stated step)."""
    if args.model:
        return (*stated(args, sources), None)
    m, half = measured(args, args.global_batch, rpn, sources)
    step = step_of(m, args.backward_share, not args.no_overlap, args.fusion_bytes, half)
    shapes = m.layout.get("tensor_shapes")
    global_batch = args.global_batch
    if global_batch is None and not args.check:
        if not m.global_batch_fixed:
            raise MeasureError(f"{m.run_dir} trained with a per-rank batch: pass "
                               "--global-batch (fixed for every node count)")
        global_batch = m.global_batch * rpn
    return step, [tuple(s) for s in shapes] if shapes else None, global_batch or 0, m


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    why = refused(args)
    if why:
        print(f"hpcdp plan: {why}", file=sys.stderr)
        return 2
    sources: Sources = []
    try:
        net, site_rpn = network_model(args, sources)
        rpn = args.ranks_per_node or site_rpn or 1
        step, shapes, global_batch, m = planned(args, rpn, sources)
        if args.check and m is not None:
            return check(args, step, net, m, sources)
        preds = model.predict(step, net, args.max_nodes, rpn, global_batch)
        chosen = advise.settings(args.powersgd_rank, args.accumulate)
        per_nodes = advise.compare(step, net, chosen, shapes, args.max_nodes, rpn,
                                   global_batch)
    except (MeasureError, network.NetworkError, ValueError) as e:
        print(f"hpcdp plan: {e}", file=sys.stderr)
        return 2
    print(f"Predicted for a global batch of {global_batch}, {rpn} rank(s) per node, "
          f"{len(step.bucket_bytes)} all-reduce(s) of {step.gradient_bytes / 2**20:.1f} MiB "
          f"in all per step; measured: compute {step.compute_s * 1e3:.1f} ms "
          f"({step.fixed_s * 1e3:.1f} of it fixed), data {step.data_s * 1e3:.2f} ms at "
          f"{step.measured_batch} samples on 1 rank:")
    print(format_predictions(preds, args.target))
    print(format_advice(per_nodes, args.target, shapes is not None))
    print("\nInputs:\n" + "\n".join(f"- {s}" for s in sources))
    print(f"- {'hierarchical' if net.hierarchical else 'flat ring'} all-reduce across nodes")
    print("Assumptions:\n" + "\n".join(f"- {a}" for a in (*model.ASSUMPTIONS,
                                                            *advise.ASSUMPTIONS)))
    if args.json:
        write_json(args.json, global_batch, rpn, sources, step, preds, per_nodes, args.target)
    return 0


def format_advice(per_nodes: Sequence[Sequence[advise.Outcome]], target: float,
                  have_shapes: bool) -> str:
    """The efficiency of each setting by node count, the cheapest that meets the target,
    and the advice at the most nodes."""
    from hpcdp.bench.common import format_table

    labels = [o.setting.label for o in per_nodes[0]]
    lines = ["\nWith less traffic per sample (efficiency against 1 node with no "
             "compression; cheapest in accuracy first):",
             format_table(["nodes", *labels, f"cheapest at {target:.0%}"],
                          advise.table_rows(per_nodes, target)),
             advise.advice(per_nodes[-1], target)]
    if not have_shapes:
        lines.append("(PowerSGD left out: the run recorded no gradient shapes)")
    return "\n".join(lines)


def write_json(path: Path, global_batch: int, rpn: int, sources: Sources, step: model.Step,
               preds: Sequence[model.Prediction],
               per_nodes: Sequence[Sequence[advise.Outcome]], target: float) -> None:
    """The predictions, the advice and their inputs, for scripts."""
    path.write_text(json.dumps({
        "global_batch": global_batch, "ranks_per_node": rpn, "inputs": sources,
        "measured": {"compute_s": step.compute_s, "fixed_s": step.fixed_s,
                     "data_s": step.data_s, "batch": step.measured_batch,
                     "bucket_bytes": list(step.bucket_bytes)},
        "assumptions": [*model.ASSUMPTIONS, *advise.ASSUMPTIONS],
        "predictions": [vars(p) | {"notes": list(p.notes)} for p in preds],
        "suggested_nodes": model.suggested_range(preds, target),
        "advice": [{"nodes": row[0].nodes, "settings": [
            {"label": o.setting.label, "overrides": list(o.setting.overrides),
             "efficiency": o.efficiency, "step_s": o.step_s, "sent_bytes": o.sent_bytes}
            for o in row], "cheapest": cheapest_label(row, target)}
            for row in per_nodes]}, indent=2) + "\n")


def cheapest_label(outcomes: Sequence[advise.Outcome], target: float) -> str | None:
    """The advice's setting at one node count, by its label; None when none meets target."""
    best = advise.cheapest(outcomes, target)
    return best.setting.label if best else None


def check(args: argparse.Namespace, step: model.Step, net: model.Network, reference: Measured,
          sources: Sources) -> int:
    from hpcdp.bench.common import format_table

    against = []
    for item in args.against:
        path, _, nodes = item.rpartition(":") if ":" in item else (item, "", "1")
        if not nodes.isdigit() or int(nodes) < 1:
            raise MeasureError(f"--against {item!r}: NODES must be a positive integer")
        against.append((read_run(Path(path), args.warmup), int(nodes)))
    rows = check_rows(args.label or reference.run_dir.name, step, net, against, reference)
    print(format_table(["model", "ranks", "nodes", "global batch", "predicted ms",
                        "measured ms", "error", "measured"], rows))
    print("\nInputs:\n" + "\n".join(f"- {s}" for s in sources))
    if args.json:
        args.json.write_text(json.dumps({"inputs": sources, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
