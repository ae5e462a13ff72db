"""Training under real launchers: outputs, resume, world-size change, parity, bad input.

Small random data (tests/parallel/conftest.py, plain h5py) and a tiny CNN keep each run to
a few seconds; every run is time-bounded by the `ranks` fixture.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from hpcdp.runtime.launcher import rank_environment
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat

pytestmark = pytest.mark.parallel

N_TRAIN, N_VAL = 480, 96
TRAIN = [sys.executable, "-m", "hpcdp.train"]
BOUND = 120.0


RUN_SETTINGS = (  # after the args fixture's SMALL_RUN; a later value of a key wins
    "optim.lr=0.05", "log.every_steps=5", "checkpoint.every_steps=0", "run.epochs=2",
)


def final_state(run: Path) -> dict:
    found = ckfolder.find_latest(run / "checkpoints")
    assert found is not None, f"no checkpoint in {run}"
    return ckformat.decode(found.data, str(found.path))


def identities(output: str) -> list[dict]:
    # A regex, not line splitting: the launcher may glue two ranks' lines together.
    return [json.loads(m) for m in re.findall(r"hpcdp-rank (\{[^{}]*\})", output)]


def assert_same_params(a: dict, b: dict, exact: bool, atol: float = 0.0) -> None:
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        if exact:
            assert torch.equal(a["model"][k], b["model"][k]), k
        else:
            torch.testing.assert_close(a["model"][k], b["model"][k], atol=atol, rtol=1e-4)


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun", "horovodrun-gloo"])
def test_trains_under_launcher(args, ranks, data: Path, tmp_path: Path, launcher: str) -> None:
    run = tmp_path / "run"
    tb = "log.tensorboard=true" if launcher == "mpirun" else "log.tensorboard=false"
    out = ranks(TRAIN, *args(data, run, "checkpoint.every_steps=10", "checkpoint.keep=2", tb),
                np=2, launcher=launcher, timeout=BOUND).output
    ids = identities(out)
    assert sorted(i["rank"] for i in ids) == [0, 1]
    assert all(i["size"] == 2 and i["device"] == "cpu" and "host" in i for i in ids)
    # hpcdp's fusion buffer for this device and backend: 1 MiB for CPU tensors through
    # MPI, Horovod's 128 MiB through Gloo (hvd_settings.fusion_threshold_bytes).
    gloo = launcher == "horovodrun-gloo"
    assert {(i["controller"], i["fusion_threshold"]) for i in ids} == {
        ("gloo", 128 << 20) if gloo else ("mpi", 1 << 20)}
    summary = json.loads((run / "summary.json").read_text())
    steps = 2 * (N_TRAIN // 32)
    assert summary["steps"] == steps and summary["world_size"] == 2
    assert summary["samples_per_s"] > 0 and 0.0 <= summary["val_acc"] <= 1.0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} == {"train", "val"}
    train_records = [r for r in records if r["kind"] == "train"]
    assert all(k in train_records[0] for k in ("loss", "acc", "lr", "data_ms", "comm_ms"))
    # Learning itself is test_lr_rule's (8 epochs to 0.95 accuracy): these 30 steps only
    # move the loss of the 4-class head (image.num_classes = auto) around ln 4.
    assert all(math.isfinite(r["loss"]) and r["loss"] < 2.0 for r in train_records)
    # keep=2: only the newest two of steps 10, 20, 30 (the end) survive.
    assert [s for s, _ in ckfolder.list_checkpoints(run / "checkpoints")] == [steps, 20]
    assert (run / "train.log").exists() and (run / "config.toml").exists()
    if launcher == "mpirun":
        assert list((run / "tensorboard").glob("events.out.tfevents.*"))


def test_single_process_without_launcher(args, data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = subprocess.run([*TRAIN, *args(data, run, "run.epochs=1")], capture_output=True,
                          text=True, timeout=BOUND, env=rank_environment(), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (ident,) = identities(done.stdout)
    assert ident["size"] == 1 and ident["rank"] == 0
    first = json.loads((run / "summary.json").read_text())
    assert first["steps"] == N_TRAIN // 16 and first["samples_per_s"] > 0
    # The finished run started again (a leftover chained segment): nothing is trained, and
    # the summary keeps the throughput of the training that happened.
    again = subprocess.run([*TRAIN, *args(data, run, "run.epochs=1")], capture_output=True,
                           text=True, timeout=BOUND, env=rank_environment(), cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    second = json.loads((run / "summary.json").read_text())
    assert second["steps"] == first["steps"] and second["resumed_from"]
    assert second["samples_per_s"] == first["samples_per_s"]


@pytest.mark.parametrize("carrier", ["buckets", "own all-reduce"])
def test_signal_checkpoint_resume_is_bitwise_identical(args, ranks, data: Path, tmp_path: Path,
                                                       carrier: str) -> None:
    # The flag goes with the gradient buckets (CPUs), or in an all-reduce of its own where
    # Horovod's DistributedOptimizer averages the gradients (GPUs, bucket_mb=0).
    common = ("optim.momentum=0.9", "optim.weight_decay=1e-4", "schedule.warmup_epochs=0.5",
              *(["horovod.bucket_mb=0"] if carrier != "buckets" else []))
    full = tmp_path / "full"
    ranks(TRAIN, *args(data, full, *common), np=2, timeout=BOUND)
    cut = tmp_path / "cut"
    worker = [sys.executable, str(Path(__file__).parent / "workers" / "train_signal.py")]
    first = ranks(worker, *args(data, cut, *common), np=2, timeout=BOUND,
                  env={"HPCDP_TEST_SIGNAL_AT": "7"})
    # Rank 1 signalled itself just before check 7 (after step 7); its flag went out with
    # step 8's last gradient bucket, whose result every rank read at check 8 (the
    # agreement is one check behind): step 8.
    assert "preempted at step 8: checkpoint written to" in first.output
    assert [s for s, _ in ckfolder.list_checkpoints(cut / "checkpoints")] == [8]
    assert not (cut / "summary.json").exists()
    second = ranks(TRAIN, *args(data, cut, *common), np=2, timeout=BOUND)
    assert "resumed from" in second.output and "step-00000008.pt" in second.output
    a, b = final_state(full), final_state(cut)
    assert a["step"] == b["step"] == 2 * (N_TRAIN // 32)
    assert_same_params(a, b, exact=True)
    for k, v in a["optimizers"][0]["state"].items():
        assert torch.equal(v["momentum_buffer"], b["optimizers"][0]["state"][k]["momentum_buffer"])


def traces(run: Path) -> dict[tuple[int, int], set[str]]:
    """(epoch, step) -> the set of sample fingerprints all ranks trained on at that step."""
    seen: dict[tuple[int, int], list[str]] = defaultdict(list)
    for f in (run / "trace").glob("rank-*.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            seen[(r["epoch"], r["step"])] += r["ids"]
    for key, ids in seen.items():
        assert len(ids) == len(set(ids)), f"a sample repeated within step {key}"
    return {k: set(v) for k, v in seen.items()}


def test_resume_on_another_world_size_continues_the_epoch(args, ranks, data: Path,
                                                          tmp_path: Path) -> None:
    common = ("data.global_batch_size=48", "log.trace_samples=true", "run.epochs=1")
    # The layout is chosen by the first run; the resumed run's defaults differ (24 virtual
    # shards, a 4 MiB window): the stored layout must win.
    layout = ("data.virtual_shards=12", "data.window_samples=40")
    ref = tmp_path / "ref"
    ranks(TRAIN, *args(data, ref, *common, *layout), np=1, timeout=BOUND)
    run = tmp_path / "run"
    ranks(TRAIN, *args(data, run, *common, *layout, "run.stop_at_step=4"), np=2, timeout=BOUND)
    assert [s for s, _ in ckfolder.list_checkpoints(run / "checkpoints")] == [4]
    out = ranks(TRAIN, *args(data, run, *common), np=1, timeout=BOUND).output
    assert "resumed from" in out
    got, want = traces(run), traces(ref)
    assert sorted(got) == sorted(want) == [(0, s) for s in range(N_TRAIN // 48)]
    assert got == want  # every step trained on the same global batch, none repeated or skipped
    everything = set().union(*got.values())
    assert len(everything) == N_TRAIN


def test_two_ranks_equal_one_rank_with_twice_the_batch(args, ranks, data: Path,
                                                       tmp_path: Path) -> None:
    plain = ("optim.momentum=0", "optim.lr_scaling=none", "schedule.kind=constant",
             "run.epochs=1", "data.virtual_shards=8")
    two, one, half = tmp_path / "two", tmp_path / "one", tmp_path / "half"
    ranks(TRAIN, *args(data, two, *plain, "data.batch_size=16"), np=2, timeout=BOUND)
    ranks(TRAIN, *args(data, one, *plain, "data.batch_size=32"), np=1, timeout=BOUND)
    a, b = final_state(two), final_state(one)
    assert a["step"] == b["step"] == N_TRAIN // 32
    assert_same_params(a, b, exact=False, atol=1e-5)
    # Control: the comparison can fail. One rank with batch 16 takes other steps.
    ranks(TRAIN, *args(data, half, *plain, "data.batch_size=16"), np=1, timeout=BOUND)
    c = final_state(half)
    assert any(not torch.allclose(a["model"][k], c["model"][k], atol=1e-3) for k in a["model"])


def failing(ranks, argv: list[str], np: int = 2) -> str:
    run = ranks(argv, np=np, timeout=60.0, expect_ok=False)
    assert not run.timed_out, run.describe()
    assert run.returncode != 0, run.describe()
    assert run.seconds < 60
    return run.output


# mpirun --tag-output prefixes what each rank writes with "[job,rank]<stream>:", but
# a message and its newline can arrive as two writes, so two ranks' text may share
# a line: split the output at the tags, not at newlines.
_TAGGED = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:((?:(?!\[\d+,\d+\]<std).)*)", re.S)


def on_every_rank(output: str, needle: str) -> None:
    ranks_saying = {int(rank) for rank, text in _TAGGED.findall(output) if needle in text}
    assert ranks_saying >= {0, 1}, output


def test_missing_config(ranks, tmp_path: Path) -> None:
    out = failing(ranks, [*TRAIN, "--config", str(tmp_path / "nope.toml")])
    on_every_rank(out, "nope.toml' does not exist")


def test_unknown_model(args, ranks, data: Path, tmp_path: Path) -> None:
    out = failing(ranks, [*TRAIN, *args(data, tmp_path / "r", "model.name=vgg11")])
    on_every_rank(out, "unknown model 'vgg11'")
    assert not (tmp_path / "r").exists()


def test_batch_that_does_not_divide(args, ranks, data: Path, tmp_path: Path) -> None:
    out = failing(ranks, [*TRAIN, *args(data, tmp_path / "r", "data.global_batch_size=33")])
    on_every_rank(out, "data.global_batch_size=33 does not divide over 2 ranks")
    assert not (tmp_path / "r").exists()


def test_missing_data(args, ranks, tmp_path: Path) -> None:
    out = failing(ranks, [*TRAIN, *args(tmp_path / "nodata", tmp_path / "r")])
    on_every_rank(out, "train.h5: no such file")


def test_checkpoint_of_another_model(args, ranks, data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ranks(TRAIN, *args(data, run, "run.epochs=1"), np=2, timeout=BOUND)
    before = {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    out = failing(ranks, [*TRAIN, *args(data, run, "model.name=resnet18", "image.width=4")])
    on_every_rank(out, "was written for model 'digits_cnn', but this run builds 'resnet18'")
    after = {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before  # nothing overwritten, nothing added


def test_corrupt_newest_checkpoint_falls_back(args, ranks, data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ranks(TRAIN, *args(data, run, "run.epochs=1", "checkpoint.every_steps=5"), np=2,
          timeout=BOUND)
    newest = ckfolder.step_path(run / "checkpoints", N_TRAIN // 32)
    newest.write_bytes(newest.read_bytes()[:-64])
    out = ranks(TRAIN, *args(data, run, "run.epochs=1", "checkpoint.every_steps=5"), np=2,
                timeout=BOUND).output
    assert "checksum mismatch" in out and "resumed from" in out and "step-00000010.pt" in out


def test_one_rank_failing_takes_the_job_down(args, ranks, data: Path, tmp_path: Path) -> None:
    worker = [sys.executable, str(Path(__file__).parent / "workers" / "train_signal.py")]
    run = ranks(worker, *args(data, tmp_path / "r"), np=2, timeout=60.0, expect_ok=False,
                env={"HPCDP_TEST_CRASH_AT": "3"})
    assert not run.timed_out and run.returncode != 0, run.describe()
    assert "[hpcdp rank 1] fatal error, aborting the job" in run.output
    assert "arranged failure at check 3" in run.output


@pytest.mark.parametrize(
    ("options", "steps"),
    [
        # ResNet-18 (small), bf16 autocast, fp16 gradient compression, 2-step accumulation,
        # gradient predivision: 8 per rank x 2 ranks x 2 passes = 32 samples per step.
        (("model.name=resnet18", "image.width=4", "image.cifar_stem=true", "run.precision=bf16",
          "horovod.compression=fp16", "horovod.backward_passes_per_step=2",
          "horovod.gradient_predivide_factor=2", "data.batch_size=8", "data.val_batch_size=8",
          "horovod.fusion_threshold_mb=1", "horovod.cycle_time_ms=5",
          "horovod.timeline=timeline.json"), N_TRAIN // 32),
        (("horovod.op=adasum", "optim.name=adamw", "optim.lr=0.003"), N_TRAIN // 32),
    ],
    ids=["resnet-bf16-fp16comp-accum", "adasum-adamw"],
)
def test_horovod_options(args, ranks, data: Path, tmp_path: Path, options: tuple[str, ...],
                         steps: int) -> None:
    run = tmp_path / "run"
    out = ranks(TRAIN, *args(data, run, "run.epochs=1", *options), np=2, timeout=BOUND).output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == steps
    state = final_state(run)
    assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())
    assert "fatal" not in out
    if any(o.startswith("horovod.timeline") for o in options):
        assert (run / "timeline.json").stat().st_size > 0
