"""Export -> load: the same outputs, bit for bit on the CPU, with no Horovod, MPI or HDF5.

Each model (digits CNN, a narrow ResNet-18, the GPT, the click model) gets random
weights (BatchNorm statistics included), is written as a real checkpoint, exported
with the export command's function, and loaded in a fresh interpreter that must
never import horovod, mpi4py or h5py. Bad exports are refused naming the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hpcdp.export import bundle
from hpcdp.export.command import export
from hpcdp.export.load import load
from hpcdp.models import spec as specs
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust

REPO = Path(__file__).resolve().parents[2]


#: The task sections a checkpoint's config holds (only its own task's), as the trainer
#: writes them: the keys the model spec reads.
SECTIONS = {
    "image": {"num_classes": 10, "width": 4, "cifar_stem": True, "scale": 255.0, "mean": 0.0,
              "std": 1.0},
    "lm": {"seq_len": 16, "layers": 1, "heads": 2, "width": 16, "mlp_ratio": 4, "dropout": 0.0},
    "recsys": {"embed_dim": 4, "bottom": [8], "top": [8]},
}


def checkpoint_config(task: str, model: str) -> dict:
    return {"task": {"name": task}, "model": {"name": model},
            "data": {"path": "/nonexistent", "train_file": "train.h5"},  # not needed
            task: dict(SECTIONS[task])}


CASES = {
    "digits": ("image", "digits_cnn", {"name": "digits_cnn", "in_channels": 1, "num_classes": 10,
                                      "width": 4, "cifar_stem": True, "image_size": 8}),
    "resnet18": ("image", "resnet18", {"name": "resnet18", "in_channels": 3, "num_classes": 10,
                                      "width": 4, "cifar_stem": True, "image_size": 16}),
    "gpt": ("lm", "gpt", {"name": "gpt", "vocab_size": 37, "seq_len": 16, "layers": 1,
                         "heads": 2, "width": 16, "mlp_ratio": 4, "dropout": 0.0}),
    "clicks": ("recsys", "dlrm", {"name": "dlrm", "dense_features": 3, "table_sizes": [5, 7],
                                 "embed_dim": 4, "bottom": [8], "top": [8]}),
}


def inputs(name: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    if name == "digits":
        return {"x": torch.rand(5, 1, 8, 8, generator=g)}
    if name == "resnet18":
        return {"x": torch.randn(5, 3, 16, 16, generator=g)}
    if name == "gpt":
        return {"x": torch.randint(0, 37, (3, 16), generator=g)}
    return {"dense": torch.randn(6, 3, generator=g),
            "sparse": torch.stack([torch.randint(0, 5, (6,), generator=g),
                                   torch.randint(0, 7, (6,), generator=g)], 1)}


def run_model(net: torch.nn.Module, x: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return net((x["dense"], x["sparse"])) if "dense" in x else net(x["x"])


def trained_model(name: str) -> torch.nn.Module:
    """The case's network with random weights and BatchNorm statistics, in eval mode."""
    torch.manual_seed(3)
    net = specs.build(CASES[name][2])
    with torch.no_grad():
        for key, t in net.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.randn_like(t) * 0.3 + (1.0 if key.endswith("running_var") else 0))
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_var.abs_()
    return net.eval()


def write_checkpoint(folder: Path, name: str, net: torch.nn.Module) -> Path:
    task, model, _ = CASES[name]
    state = {"format": 2, "task": task, "model_name": model, "step": 5, "epoch": 1,
             "model": net.state_dict(), "optimizers": [{"state": {}, "param_groups": []}],
             "config": checkpoint_config(task, model), "world_size": 1}
    path = ckfolder.step_path(folder / name, 5)
    ckformat.write_atomic(path, ckformat.encode(state))
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, tuple[Path, torch.Tensor]]:
    """{case: (export folder, the trained model's outputs)}; inputs saved beside."""
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for name in CASES:
        net = trained_model(name)
        source = write_checkpoint(root / "ckpts", name, net)
        folder = root / "exp" / name
        config = export(source, folder)
        want = dict(CASES[name][2])
        if name == "resnet18":  # pools globally: its input size is the data's, absent here
            want["image_size"] = None
        assert config["model"] == want
        save_file(inputs(name), str(folder / "inputs.safetensors"))
        out[name] = (folder, run_model(net, inputs(name)))
    return out


LOADER = """
import sys, torch
from safetensors.torch import load_file, save_file
from hpcdp.export import load
for folder in sys.argv[1:]:
    net, config = load(folder)
    assert not net.training
    x = load_file(folder + "/inputs.safetensors")
    with torch.no_grad():
        y = net((x["dense"], x["sparse"])) if "dense" in x else net(x["x"])
    save_file({"y": y.contiguous()}, folder + "/outputs.safetensors")
banned = sorted(m for m in sys.modules if m.split(".")[0] in ("horovod", "mpi4py", "h5py"))
print("BANNED", banned)
"""


def test_loaded_models_give_the_trained_outputs_without_horovod(exported) -> None:
    folders = [str(folder) for folder, _ in exported.values()]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", LOADER, *folders], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "BANNED []" in done.stdout, done.stdout
    for name, (folder, expected) in exported.items():
        got = load_file(str(folder / "outputs.safetensors"))["y"]
        assert torch.equal(got, expected), name


def test_the_export_holds_only_the_model(exported) -> None:
    folder, _ = exported["gpt"]
    tensors = load_file(str(folder / bundle.WEIGHTS))
    assert "head.weight" not in tensors  # tied to tok_emb.weight: stored once
    assert all(not k.startswith(("optim", "reader", "rng")) for k in tensors)
    config = json.loads((folder / bundle.CONFIG).read_text())
    assert config["input"]["vocab_size"] == 37 and config["task"] == "lm"
    assert not (set(config) & {"optimizers", "reader", "rng"})


def copy_export(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in (bundle.WEIGHTS, bundle.CONFIG):
        (dst / f).write_bytes((src / f).read_bytes())
    return dst


def test_planted_weights_are_refused(exported, tmp_path: Path) -> None:
    folder = copy_export(exported["digits"][0], tmp_path / "e")
    tensors = load_file(str(folder / bundle.WEIGHTS))
    save_file({k: torch.zeros_like(v) for k, v in tensors.items()}, str(folder / bundle.WEIGHTS))
    with pytest.raises(bundle.ExportError, match=r"model\.safetensors: .*(bytes|sha256)"):
        load(folder)


def test_planted_weights_of_the_same_size_are_refused_by_hash(exported, tmp_path: Path) -> None:
    folder = copy_export(exported["digits"][0], tmp_path / "e")
    data = bytearray((folder / bundle.WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (folder / bundle.WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(bundle.ExportError, match=r"model\.safetensors: sha256 .* altered"):
        load(folder)


def test_truncated_weights_are_refused(exported, tmp_path: Path) -> None:
    folder = copy_export(exported["clicks"][0], tmp_path / "e")
    data = (folder / bundle.WEIGHTS).read_bytes()
    (folder / bundle.WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(bundle.ExportError, match=r"model\.safetensors: \d+ bytes.*truncated"):
        load(folder)


def test_a_config_that_does_not_match_the_weights_is_refused(exported, tmp_path: Path) -> None:
    folder = copy_export(exported["gpt"][0], tmp_path / "e")
    config = json.loads((folder / bundle.CONFIG).read_text())
    config["model"]["width"] = 32
    (folder / bundle.CONFIG).write_text(json.dumps(config))
    with pytest.raises(bundle.ExportError, match=r"model\.safetensors: .*needs .*config\.json"):
        load(folder)


def test_a_weights_file_that_is_no_safetensors_is_refused(exported, tmp_path: Path) -> None:
    folder = copy_export(exported["digits"][0], tmp_path / "e")
    junk = b"\x80\x04not a safetensors file"
    (folder / bundle.WEIGHTS).write_bytes(junk)
    config = json.loads((folder / bundle.CONFIG).read_text())
    import hashlib

    config["weights"].update(bytes=len(junk), sha256=hashlib.sha256(junk).hexdigest())
    (folder / bundle.CONFIG).write_text(json.dumps(config))
    with pytest.raises(bundle.ExportError, match=r"model\.safetensors: not a readable"):
        load(folder)


def test_export_refuses_what_resume_refuses(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "c", "digits", trained_model("digits"))
    os.chmod(path, 0o666)
    with pytest.raises(cktrust.UntrustedError, match="writable by others"):
        export(path, tmp_path / "out")
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ckformat.CheckpointError, match="corrupt or incomplete"):
        export(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
