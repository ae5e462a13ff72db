"""`hpcdp checkpoint convert` as its users meet it: help, usage errors, messages, flags.

Each test pins down a behaviour that mutation testing (`make mutate`) found unguarded.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest
import torch

from hpcdp import checkpoint as ck


def legacy_file(path: Path, state: dict) -> Path:
    """A format-1 checkpoint (torch.save of the state, behind the old header)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    path.write_bytes(ck.LEGACY_MAGIC + b"sha256 " + digest + b"\n" + payload)
    return path


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str],
              monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit) as err:
        ck.main(argv)
    assert err.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_warns_what_converting_does(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    text = help_text(["--help"], capsys, monkeypatch)
    assert text.startswith(
        "usage: hpcdp checkpoint [-h] {convert} ... Convert a checkpoint written before hpcdp "
        "loaded checkpoints without running code. Converting unpickles the old file fully, which "
        "runs any code it names: convert only files you wrote yourself and no one else could "
        "have changed. ")
    assert "convert rewrite an old (format 1) checkpoint, once" in text
    text = help_text(["convert", "--help"], capsys, monkeypatch)
    assert text.startswith(
        "usage: hpcdp checkpoint convert [-h] [--out OUT] [--allow-group-write] path ")
    for line in ("path the checkpoint file (step-N.pt)",
                 "--out OUT write here instead of replacing the file",
                 "--allow-group-write accept a file or folder that your group can write"):
        assert line in text, line


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        ck.main([])
    assert err.value.code == 2
    assert capsys.readouterr().err.endswith(
        "hpcdp checkpoint: error: the following arguments are required: command\n")


def test_convert_to_another_file_says_so(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    old = legacy_file(tmp_path / "step-00000002.pt", {"step": 2})
    before = old.read_bytes()
    out = tmp_path / "new.pt"
    assert ck.main(["convert", str(old), "--out", str(out)]) == 0
    assert capsys.readouterr().out == (
        f"converted {old} -> {out}: it now loads without running code\n")
    assert old.read_bytes() == before  # --out leaves the old file as it was
    assert ck.decode(out.read_bytes(), str(out))["step"] == 2


def test_a_refusal_is_one_line_on_stderr(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    old = legacy_file(tmp_path / "step-00000002.pt", {"step": 2})
    assert ck.main(["convert", str(old)]) == 0
    capsys.readouterr()
    assert ck.main(["convert", str(old)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == (f"hpcdp checkpoint: error: {old}: already in the current format; "
                       "nothing to convert\n")

