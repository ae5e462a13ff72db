"""The mutation report's arithmetic: killed, survived, untested and equivalent per module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mutation_report",
                                              REPO / "scripts" / "mutation_report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)  # type: ignore[union-attr]


def test_tally_and_share() -> None:
    codes = {"hpcdp.a.x_f__mutmut_1": 1, "hpcdp.a.x_f__mutmut_2": 0, "hpcdp.a.x_f__mutmut_3": 0,
             "hpcdp.a.x_g__mutmut_1": 33, "hpcdp.b.x_h__mutmut_1": 1}
    per = report.tally(codes, equivalent={"hpcdp.a.x_f__mutmut_3"})
    a, b = per["hpcdp.a"], per["hpcdp.b"]
    assert (a["killed"], a["survived"], a["other"], a["equivalent"]) == (1, 1, 1, 1)
    assert report.survivor_share(a) == 2 / 3  # equivalents leave the denominator too
    assert report.survivor_share(b) == 0.0


def test_a_mutant_that_makes_the_tests_hang_is_detected() -> None:
    codes = {"hpcdp.a.x_f__mutmut_1": -24, "hpcdp.a.x_f__mutmut_2": 0,
             "hpcdp.a.x_f__mutmut_3": 33, "hpcdp.a.x_f__mutmut_4": None}
    a = report.tally(codes, equivalent=set())["hpcdp.a"]
    assert (a["timeout"], a["survived"], a["other"]) == (1, 1, 2)
    assert report.survivor_share(a) == 3 / 4  # the timeout counts as detected


def test_main_fails_above_the_bound(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x.py.meta").write_text(
        '{"exit_code_by_key": {"hpcdp.x.x_f__mutmut_1": 1, "hpcdp.x.x_f__mutmut_2": 0}}')
    eq = tmp_path / "eq.toml"
    eq.write_text("")
    argv = ["--mutants", str(tmp_path / "m"), "--equivalent", str(eq)]
    assert report.main(argv) == 1
    eq.write_text('"hpcdp.x.x_f__mutmut_2" = "a message text only"\n')
    assert report.main(argv) == 0
