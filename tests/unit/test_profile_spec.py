"""`run.profile`: the spec's grammar, its errors (named by the key, at config time), and the
profiler's start, per-step labels and stop at the step boundaries the loop calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpcdp import config as c
from hpcdp.config import ConfigError
from hpcdp.profile_spec import MAX_STEPS, ProfileSpec, ProfileSpecError, parse, ranks_error
from hpcdp.train import profiling


@pytest.mark.parametrize(("text", "spec"), [
    ("", None), ("  ", None),
    ("steps=20-25", ProfileSpec(20, 25)),
    ("steps=7", ProfileSpec(7, 7)),
    ("steps=20-25 ranks=0,1", ProfileSpec(20, 25, (0, 1))),
    ("ranks=3;steps=1-10", ProfileSpec(1, 10, (3,))),
    ("steps=2-3  stacks shapes", ProfileSpec(2, 3, None, shapes=True, stacks=True)),
])
def test_specs_parse(text, spec) -> None:
    assert parse(text) == spec


@pytest.mark.parametrize(("text", "needle"), [
    ("ranks=0", "no steps=A-B"),
    ("steps=0-3", "count from 1"),
    ("steps=5-3", "A <= B"),
    (f"steps=1-{MAX_STEPS + 1}", f"covers {MAX_STEPS + 1} steps; at most {MAX_STEPS}"),
    ("steps=a-b", "expected a step N or a range"),
    ("steps=1-2 ranks=0,x", "rank numbers separated by commas"),
    ("steps=1-2 ranks=1,1", "named twice"),
    ("steps=1-2 steps=3-4", "steps is given twice"),
    ("steps=1-2 memory", "unknown part 'memory'"),
    ("step=1-2", "unknown part 'step=1-2'"),
])
def test_bad_specs_name_the_key_and_the_part(text, needle) -> None:
    with pytest.raises(ProfileSpecError, match="run.profile=") as info:
        parse(text)
    assert needle in str(info.value)


def test_a_bad_spec_is_a_config_error_before_any_rank_starts() -> None:
    with pytest.raises(ConfigError, match=r"run.profile='steps=1-99': steps=1-99 covers 99"):
        c.build(None, ["data.path=d", "run.profile=steps=1-99"])
    assert c.build(None, ["data.path=d", "run.profile=steps=3-4"]).run.profile == "steps=3-4"


def test_ranks_beyond_the_world_are_named() -> None:
    assert ranks_error(parse("steps=1 ranks=0,1"), 2) is None
    assert ranks_error(parse("steps=1"), 1) is None and ranks_error(None, 1) is None
    error = ranks_error(parse("steps=1 ranks=0,2,5"), 2)
    assert error is not None and "ranks 2, 5 are not in this run of 2 rank(s)" in error


def test_ranks_left_out_get_no_profiler(tmp_path: Path) -> None:
    spec = parse("steps=1 ranks=1")
    assert profiling.for_rank(spec, 0, tmp_path, "cpu") is None
    assert profiling.for_rank(None, 0, tmp_path, "cpu") is None
    assert profiling.for_rank(spec, 1, tmp_path, "cpu") is not None


def test_the_trace_holds_the_chosen_steps_and_names_rank_and_host(tmp_path: Path) -> None:
    prof = profiling.for_rank(parse("steps=3-4"), 1, tmp_path, "cpu")
    assert prof is not None
    weights = torch.ones(8, 8, requires_grad=True)
    for step in range(6):  # the loop's 0-based steps: the logs' steps 1 to 6
        prof.before_step(step)
        (weights @ weights).sum().backward()
    path = profiling.trace_path(tmp_path, 1, prof.host)
    assert path.exists(), "the trace is written when step 5 starts, after the range"
    prof.close()  # nothing more to write
    trace = json.loads(path.read_text())
    assert trace["hpcdp"] == {"rank": 1, "host": prof.host, "steps": [3, 4]}
    labels = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("hpcdp")}
    assert labels == {"hpcdp step 3", "hpcdp step 4"}
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])


def test_a_run_ending_inside_the_range_writes_what_it_recorded(tmp_path: Path) -> None:
    prof = profiling.for_rank(parse("steps=2-5"), 0, tmp_path, "cpu")
    assert prof is not None
    for step in range(3):
        prof.before_step(step)
    path = profiling.trace_path(tmp_path, 0, prof.host)
    assert not path.exists()
    prof.close()
    labels = {e["name"] for e in json.loads(path.read_text())["traceEvents"]
              if e.get("name", "").startswith("hpcdp")}
    assert labels == {"hpcdp step 2", "hpcdp step 3"}
