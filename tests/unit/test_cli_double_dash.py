"""`--opt=--` is a usage error naming the option in every command, not a traceback or,
worse, a run with an empty list for a value (`hpcdp bench train --name=--` used to run
the whole benchmark and write `[].json`)."""

from __future__ import annotations

import pytest

from hpcdp import cli


@pytest.mark.parametrize("argv", [
    ["bench", "all", "--out=--"],
    ["bench", "allreduce", "--sizes=--"],
    ["bench", "fusion", "--tensors=--"],
    ["bench", "prep", "--shape=--"],
    ["bench", "reader", "--shape=--"],
    ["bench", "train", "--name=--"],
    ["doctor", "--timeout=--"],
    ["checkpoint", "convert", "x.pt", "--out=--"],
])
def test_an_attached_double_dash_is_a_usage_error(argv: list[str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    option = argv[-1].removesuffix("=--")
    assert f"argument {option}: '--' is not a value" in capsys.readouterr().err
