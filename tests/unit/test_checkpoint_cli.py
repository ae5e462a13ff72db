"""`hpcdp checkpoint convert` as its users meet it: help, usage errors, messages, flags.

Each test pins down a behaviour that mutation testing (`make mutate`) found unguarded.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest
import torch

from hpcdp.train import checkpoint_convert as ckconvert
from hpcdp.train import checkpoint_format as ckformat


def legacy_file(path: Path, state: dict) -> Path:
    """A format-1 checkpoint (torch.save of the state, behind the old header)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    path.write_bytes(ckformat.LEGACY_MAGIC + b"sha256 " + digest + b"\n" + payload)
    return path


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str],
              monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit) as err:
        ckconvert.main(argv)
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
        ckconvert.main([])
    assert err.value.code == 2
    assert capsys.readouterr().err.endswith(
        "hpcdp checkpoint: error: the following arguments are required: command\n")


def test_convert_to_another_file_says_so(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    old = legacy_file(tmp_path / "step-00000002.pt", {"step": 2})
    before = old.read_bytes()
    out = tmp_path / "new.pt"
    assert ckconvert.main(["convert", str(old), "--out", str(out)]) == 0
    assert capsys.readouterr().out == (
        f"converted {old} -> {out}: it now loads without running code\n")
    assert old.read_bytes() == before  # --out leaves the old file as it was
    assert ckformat.decode(out.read_bytes(), str(out))["step"] == 2


def test_a_refusal_is_one_line_on_stderr(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    old = legacy_file(tmp_path / "step-00000002.pt", {"step": 2})
    assert ckconvert.main(["convert", str(old)]) == 0
    capsys.readouterr()
    assert ckconvert.main(["convert", str(old)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == (f"hpcdp checkpoint: error: {old}: already in the current format; "
                       "nothing to convert\n")



# ---- what a checkpoint may hold, and refusals in full -----------------------------------


def test_a_state_dict_with_numpy_keeps_its_kind_and_metadata() -> None:
    from collections import OrderedDict

    import numpy as np

    sd = torch.nn.Linear(2, 1).state_dict()
    sd["extra"] = np.float32(0.5)
    safe = ckformat.to_safe(sd)
    assert type(safe) is OrderedDict and list(safe) == list(sd)
    assert safe._metadata == sd._metadata and safe["extra"] == 0.5
    got = ckformat.to_safe({"a": [np.int64(1), {2, 3}], "b": (np.int64(4),)})
    assert got == {"a": [1, {2, 3}], "b": (4,)} and type(got["b"]) is tuple
    assert type(got["a"]) is list and type(got["a"][1]) is set


def test_unsavable_objects_are_named_where_they_sit() -> None:
    class Odd:
        pass

    for obj, where in (({"k": [1, Odd()]}, "state['k'][1]"), ({Odd(): 1}, "a key of state")):
        with pytest.raises(ckformat.CheckpointError) as err:
            ckformat.to_safe(obj)
        assert str(err.value) == (
            f"{where} is a {Odd.__module__}.{Odd.__qualname__}; a checkpoint holds only "
            "tensors, numbers, strings, lists, tuples and dicts (convert it before saving)")


def test_refusal_messages_in_full() -> None:
    assert ckformat.refusal("a.pt", 2, "Unsupported operand 149") == (
        "a.pt: refused: it holds objects other than tensors, numbers, strings, lists and dicts, "
        "which hpcdp never writes and whose loading could run code: the file was not written "
        "by hpcdp, or was altered after. It was not loaded")
    assert ckformat.refusal(
            "b c.pt", 1, "Unsupported global: GLOBAL os.system was not allowed") == (
        "b c.pt: refused: this checkpoint was written by an older hpcdp and holds a reference "
        "to os.system; loading it could run code. If you wrote it yourself and no one else "
        "could have written it since, convert it once, knowingly: "
        "hpcdp checkpoint convert 'b c.pt'")


def test_convert_refusals_name_the_file(tmp_path: Path) -> None:
    not_dict = legacy_file(tmp_path / "step-00000001.pt", {"step": 1})
    buf = io.BytesIO()
    torch.save([1, 2], buf)
    payload = buf.getvalue()
    not_dict.write_bytes(ckformat.LEGACY_MAGIC + b"sha256 " + hashlib.sha256(payload).hexdigest()
                         .encode() + b"\n" + payload)
    with pytest.raises(ckformat.CheckpointError) as err:
        ckconvert.convert_legacy(not_dict, not_dict)
    assert str(err.value) == f"{not_dict}: payload is not a state dict"
    broken = tmp_path / "step-00000003.pt"
    junk = b"not a pickle"
    broken.write_bytes(ckformat.LEGACY_MAGIC + b"sha256 "
                       + hashlib.sha256(junk).hexdigest().encode() + b"\n" + junk)
    with pytest.raises(ckformat.CheckpointError) as err:
        ckconvert.convert_legacy(broken, broken)
    assert str(err.value).startswith(f"{broken}: cannot be deserialized: ")
    current = tmp_path / "step-00000002.pt"
    ckconvert.convert_legacy(legacy_file(current, {"step": 2}), current)
    with pytest.raises(ckformat.CheckpointError) as err:
        ckconvert.convert_legacy(current, current)
    assert str(err.value) == f"{current}: already in the current format; nothing to convert"


def test_arrays_are_copied_and_widened_into_tensors() -> None:
    import numpy as np

    arr = np.arange(3, dtype=np.float32)
    t = ckformat.to_safe({"a": arr})["a"]
    arr[0] = 9  # the saved state does not follow later changes to the array
    assert t.tolist() == [0.0, 1.0, 2.0]
    wide = ckformat.to_safe(np.array([1, 65535], np.uint16))
    assert wide.dtype == torch.int64 and wide.tolist() == [1, 65535]
    with pytest.raises(ckformat.CheckpointError) as err:
        ckformat.to_safe({"o": np.array([object()])})
    assert str(err.value) == ("state['o'] is a NumPy array of dtype object, which a checkpoint "
                              "cannot hold as a tensor")
