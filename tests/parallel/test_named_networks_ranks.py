"""Named networks on 2 ranks: a library's network trains, resumes bitwise, exports and serves.

`model.name = torchvision:resnet18` and a tiny timm ViT train on an image file, and a
transformers Llama built from its config class on Markov token files. Each run is
stopped mid-epoch and resumed on 2 ranks, and must end bitwise equal to the
uninterrupted run; the exported bundle, loaded where Horovod is never imported, gives
the checkpoint's logits bitwise; `hpcdp predict` classifies an image file with it and
`hpcdp generate` samples the Llama (the same tokens from the run and from its export).
The ResNet-18's runs (80 s here, 11 M parameters) add little to the ViT's (the same path
through the image task; tests/unit/test_named_networks.py builds both): they are in the
extended tier.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep.text import markov as mk
from hpcdp.runtime.launcher import rank_environment
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import trained

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]
HPCDP = [sys.executable, "-m", "hpcdp"]
BOUND = 180.0
N_TRAIN, N_VAL = 64, 32
#: 64 samples, 8 per rank on 2 ranks: 4 steps per epoch, 8 in all; step 5 is mid-epoch.
IMAGE_RUN = ("image.num_classes=4", "data.batch_size=8", "data.val_batch_size=16",
             "run.epochs=2", "log.every_steps=2", "log.tensorboard=false")
IMAGE_NETS = {
    "resnet18": ("model.name=torchvision:resnet18",),
    "vit": ("model.name=timm:vit_tiny_patch16_224",
            "model.kwargs={img_size=16, patch_size=4, depth=2}"),
}
SEQ = 16
LLAMA_RUN = ("task.name=lm", "model.name=transformers:LlamaConfig",
             "model.kwargs={hidden_size=16, intermediate_size=32, num_hidden_layers=2, "
             "num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16}",
             f"lm.seq_len={SEQ}", "data.batch_size=8", "data.val_batch_size=8",
             "run.epochs=2", "run.max_steps=10", "log.every_steps=5", "log.tensorboard=false")


def write_images(path: Path, n: int, seed: int) -> None:
    """3-channel 16x16 uint8 images with 4 learnable classes (two pixels decide)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 3, 16, 16), dtype=np.uint8)
    y = (x[:, 0, 8, 8] // 128 + 2 * (x[:, 1, 4, 4] // 128)).astype(np.int64)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(16, 3, 16, 16))
        f.create_dataset("y", data=y, chunks=(16,))


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("images")
    write_images(d / "train.h5", N_TRAIN, 1)
    write_images(d / "val.h5", N_VAL, 2)
    return d


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train.h5 and val.h5 of a 16-symbol Markov chain, named as datasets/markov.py names
    its tokenizer (ids without text: hpcdp generate writes them as numbers)."""
    d = tmp_path_factory.mktemp("markov")
    chain = mk.random_chain(16, 2, 0.1, seed=3)
    for name, split, docs in (("train.h5", 0, 200), ("val.h5", 1, 40)):
        meta = tk.TokenMeta(chain.vocab_size, chain.eod, "markov-16", "00" * 32)
        tk.write_tokens(d / name, mk.sample_documents(chain, 0, split, 0, docs), meta)
    return d


def final_state(run: Path) -> dict:
    found = ckfolder.find_latest(run / "checkpoints")
    assert found is not None, f"no checkpoint in {run}"
    return ckformat.decode(found.data, str(found.path))


def stopped_and_resumed(ranks, base: list[str], tmp_path: Path, stop: int) -> tuple[Path, Path]:
    """(uninterrupted run, run stopped at step `stop` and resumed), both on 2 ranks."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    ranks(TRAIN, *base, f"run.dir={full}", np=2, timeout=BOUND)
    ranks(TRAIN, *base, f"run.dir={cut}", f"run.stop_at_step={stop}", np=2, timeout=BOUND)
    assert not (cut / "summary.json").exists()
    second = ranks(TRAIN, *base, f"run.dir={cut}", np=2, timeout=BOUND)
    assert "resumed from" in second.output
    a, b = final_state(full), final_state(cut)
    assert a["step"] == b["step"] and a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for k, v in a["optimizers"][0]["state"].items():
        for name, t in v.items():
            assert torch.equal(t, b["optimizers"][0]["state"][k][name]), (k, name)
    return full, cut


def hpcdp(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*HPCDP, *args], capture_output=True, text=True, timeout=BOUND,
                          env=rank_environment(), cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


LOAD = """\
import sys
import numpy as np
import torch
from hpcdp.export.load import load
net, config = load(sys.argv[1])
with torch.no_grad():
    out = net(torch.from_numpy(np.load(sys.argv[2])))
np.save(sys.argv[3], (out if isinstance(out, torch.Tensor) else out.logits).numpy())
print(config["model"]["name"], "horovod" in sys.modules)
"""


def exported_logits(export: Path, inputs: np.ndarray, tmp_path: Path) -> np.ndarray:
    """The export's logits for `inputs`, computed in a process that never imports Horovod."""
    np.save(tmp_path / "inputs.npy", inputs)
    done = subprocess.run([sys.executable, "-c", LOAD, str(export), str(tmp_path / "inputs.npy"),
                           str(tmp_path / "logits.npy")], capture_output=True, text=True,
                          timeout=BOUND, env=rank_environment())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False", done.stdout  # Horovod was never imported
    return np.load(tmp_path / "logits.npy")


@pytest.mark.parametrize("net", [pytest.param("resnet18", marks=pytest.mark.extended), "vit"])
def test_an_image_network_by_name_resumes_bitwise_exports_and_predicts(
        ranks, images: Path, tmp_path: Path, net: str) -> None:
    base = [f"data.path={images}", *IMAGE_RUN, *IMAGE_NETS[net]]
    full, _ = stopped_and_resumed(ranks, base, tmp_path, stop=5)
    summary = json.loads((full / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["model"] == IMAGE_NETS[net][0].split("=", 1)[1]

    export = tmp_path / "export"
    hpcdp("export", str(full), "--out", str(export), cwd=tmp_path)
    with h5py.File(images / "val.h5") as f:
        pixels = f["x"][:8]
    inputs = pixels.astype(np.float32) / 255.0
    model = trained.load(full).model
    with torch.no_grad():
        expected = model(torch.from_numpy(inputs)).numpy()
    assert np.array_equal(exported_logits(export, inputs, tmp_path), expected)

    from PIL import Image

    Image.fromarray(pixels[0].transpose(1, 2, 0)).save(tmp_path / "first.png")
    said = hpcdp("predict", str(export), str(tmp_path / "first.png"), "--json", cwd=tmp_path)
    rows = [json.loads(line) for line in said.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 1 and 0 <= rows[0]["top"][0]["class"] < 4, said.stdout


def test_a_transformers_llama_resumes_bitwise_and_generates(ranks, corpus: Path,
                                                            tmp_path: Path) -> None:
    base = [f"data.path={corpus}", *LLAMA_RUN]
    full, _ = stopped_and_resumed(ranks, base, tmp_path, stop=6)
    summary = json.loads((full / "summary.json").read_text())
    assert summary["steps"] == 10 and 0 < summary["val_loss"] < np.log(17)  # below uniform
    recorded = (full / "config.toml").read_text()
    assert "vocab_size = 17" in recorded  # the token file's, for a rebuild without data

    export = tmp_path / "export"
    hpcdp("export", str(full), "--out", str(export), cwd=tmp_path)
    windows = np.arange(2 * SEQ, dtype=np.int64).reshape(2, SEQ) % 17
    model = trained.load(full).model
    with torch.no_grad():
        expected = model(torch.from_numpy(windows)).logits.numpy()
    assert np.array_equal(exported_logits(export, windows, tmp_path), expected)

    sampled = []
    for source in (full, export):
        out = tmp_path / f"{source.name}.npy"
        hpcdp("generate", str(source), "--tokens", "40", "--seed", "1", "--ids", "--out",
              str(out), cwd=tmp_path)
        sampled.append(np.load(out))
    assert len(sampled[0]) == 40 and sampled[0].min() >= 0 and sampled[0].max() < 17
    assert np.array_equal(sampled[0], sampled[1])  # past the 16-token window: it slid
