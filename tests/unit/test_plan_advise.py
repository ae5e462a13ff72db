"""`hpcdp plan`'s advice: the bytes each setting sends, its step worked out by hand, the
cheapest that meets the target, and ResNet-50 on a 10 GbE site."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpcdp.plan import advise, cli
from hpcdp.plan.model import Link, Network, Step
from hpcdp.plan.stated import model_gradients

SITE = Path(__file__).resolve().parents[2] / "slurm" / "sites" / "ethernet.toml"


def test_powersgd_rounds_by_hand() -> None:
    shapes = [(64, 3, 3, 3), (64,), (1000, 2048), (10, 4)]
    # Rank 4, at least 1000 elements: the conv (64 x 27) and the 1000 x 2048 go as factors,
    # P 64 x 4 and 1000 x 4, Q 27 x 4 and 2048 x 4; the bias and the 10 x 4 whole, with P.
    assert advise.powersgd_rounds(shapes, 4, 1000) == ((256 + 4000 + 64 + 40) * 4,
                                                       (108 + 8192) * 4)
    # The 10 x 4 gains at rank 1 (14 < 40) once small tensors may be compressed, not at 4.
    assert advise.powersgd_rounds([(10, 4)], 1, 1) == (10 * 4, 4 * 4)
    assert advise.powersgd_rounds([(10, 4)], 4, 1) == (40 * 4, 0)


def one_node_net(alpha: float = 0.0) -> Network:
    link = Link(alpha, 1e-9)  # 1 GB/s
    return Network(link, link)


STEP = Step(0.1, 0.0, 32, (100_000_000,), 2 / 3, True)  # 100 ms at 32 samples, 100 MB
SHAPES = [(5000, 5000)]  # the 100 MB as one matrix


def outcomes(shapes: list[tuple[int, ...]] | None, alpha: float = 0.0) -> list[advise.Outcome]:
    chosen = advise.settings(4, 4)
    per_nodes = advise.compare(STEP, one_node_net(alpha), chosen, shapes, 2, 1, 64)
    assert [o.nodes for o in per_nodes[1]] == [2] * len(per_nodes[1])
    return per_nodes[1]


def test_each_setting_worked_out_by_hand() -> None:
    none, bf16, psgd, acc = outcomes(SHAPES)
    # 1 node, 1 rank, 64 samples: 200 ms, no all-reduce: 320 samples/s is the base.
    # 2 nodes: 32 samples each (100 ms); the 100 MB ring over 2 ranks: 2 x 1/2 x 100 MB at
    # 1 GB/s = 100 ms, ready only when backward ends: all exposed.
    assert none.step_s == pytest.approx(0.2) and none.efficiency == pytest.approx(0.5)
    assert bf16.step_s == pytest.approx(0.15) and bf16.sent_bytes == 50_000_000
    assert bf16.efficiency == pytest.approx(64 / 0.15 / 640)
    # PowerSGD rank 4: 4 x 10000 floats = 160 kB in two rounds of 80 kB, 80 us each.
    assert psgd.sent_bytes == 160_000 and psgd.step_s == pytest.approx(0.1 + 160e-6)
    # Accumulate 4: 4 x 100 ms of compute, one all-reduce: 256 samples in 500 ms.
    assert acc.step_s == pytest.approx(0.5) and acc.samples_per_s == pytest.approx(512)
    assert acc.efficiency == pytest.approx(0.8)


def test_powersgd_pays_latency_twice() -> None:
    psgd = outcomes(SHAPES, alpha=1e-3)[2]
    # Each round over 2 ranks: 2 (p - 1) alpha = 2 ms, plus 80 us of bytes; no overlap.
    assert psgd.step_s == pytest.approx(0.1 + 2 * (2e-3 + 80e-6))


def test_the_cheapest_that_meets_the_target() -> None:
    found = outcomes(SHAPES)
    assert advise.cheapest(found, 0.4).setting.label == "none"
    assert advise.cheapest(found, 0.6).setting.label == "bf16"
    assert advise.cheapest(found, 0.9).setting.label == "powersgd rank 4"
    assert advise.cheapest(found, 1.0) is None
    assert "no setting reaches 100%" in advise.advice(found, 1.0)
    # Without the shapes PowerSGD is left out, and accumulation is what reaches 75%.
    found = outcomes(None)
    assert [o.setting.label for o in found] == ["none", "bf16", "accumulate 4"]
    assert advise.cheapest(found, 0.75).setting.label == "accumulate 4"
    line = advise.advice(found, 0.75)
    assert line.startswith("at 2 node(s): use accumulate 4 "
                           "(horovod.backward_passes_per_step=4): 80% predicted with it, "
                           "50% without")


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="rank must be positive"):
        advise.settings(0, 4)
    with pytest.raises(ValueError, match="at least 2"):
        advise.settings(4, 1)


def test_resnet50_gradients() -> None:
    shapes = model_gradients("resnet50", (3, 224, 224), 1000)
    assert sum(math.prod(s) for s in shapes) == 25_557_032
    assert shapes[0] == (1000,) and shapes[1] == (1000, 2048)  # the head's bias first
    first, second = advise.powersgd_rounds(shapes, 4, advise.MIN_ELEMENTS)
    assert first + second < 25_557_032 * 4 / 20


def test_plan_advises_resnet50_on_10gbe_at_8_nodes(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = cli.main(["--model", "resnet50", "--compute-ms", "100", "--measured-batch", "32",
                     "--global-batch", "1024", "--site", str(SITE), "--max-nodes", "8",
                     "--target", "0.8", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    at8 = json.loads(out.read_text())["advice"][-1]
    effs = {s["label"]: s["efficiency"] for s in at8["settings"]}
    assert at8["nodes"] == 8 and at8["cheapest"] not in (None, "none")
    assert effs["none"] < 0.8 <= effs[at8["cheapest"]]
    assert (f"at 8 node(s): use {at8['cheapest']} (horovod.compression=powersgd "
            f"horovod.powersgd_rank=4): {effs[at8['cheapest']]:.0%} predicted with it, "
            f"{effs['none']:.0%} without (target 80%)") in printed
    # The site's 10 GbE is what the prediction used.
    assert f"network: site profile {SITE} [network]" in printed


@pytest.mark.parametrize("argv,message", [
    (["--model", "resnet50"], "--model and --compute-ms go together"),
    (["--model", "resnet50", "--compute-ms", "10", "--run", "x"], "give --config CFG"),
    (["--model", "resnet50", "--compute-ms", "10", "--powersgd-rank", "0"], "--powersgd-rank"),
    (["--model", "resnet50", "--compute-ms", "10", "--accumulate", "1"], "--accumulate"),
    (["--model", "nosuch", "--compute-ms", "10", "--site", str(SITE)], "unknown model"),
])
def test_stated_step_refusals(argv: list[str], message: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_run_folder_with_shapes_gets_powersgd(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from test_plan_cli import ALLREDUCE, write_run

    (tmp_path / "ar.json").write_text(json.dumps(ALLREDUCE))
    plain = write_run(tmp_path / "plain", 1, 32, 21.0)
    argv = ["--allreduce", str(tmp_path / "ar.json"), "--max-nodes", "2"]
    assert cli.main(["--run", str(plain), *argv]) == 0
    assert "(PowerSGD left out: the run recorded no gradient shapes)" in capsys.readouterr().out
    shaped = write_run(tmp_path / "shaped", 1, 32, 21.0)
    summary = json.loads((shaped / "summary.json").read_text())
    # The layout's 400, 600 and 1000 kB as float32 matrices, in backward's order.
    summary["gradients"]["tensor_shapes"] = [[100, 1000], [150, 1000], [250, 1000]]
    (shaped / "summary.json").write_text(json.dumps(summary))
    assert cli.main(["--run", str(shaped), *argv, "--json", str(tmp_path / "p.json")]) == 0
    assert "powersgd rank 4" in capsys.readouterr().out
    at2 = json.loads((tmp_path / "p.json").read_text())["advice"][1]["settings"]
    psgd = next(s for s in at2 if s["label"] == "powersgd rank 4")
    assert psgd["sent_bytes"] == 4 * 4 * (100 + 150 + 250 + 3 * 1000)
