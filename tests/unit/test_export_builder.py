"""A model its task's builder made is exported by reference and rebuilt by calling it again.

The user's task (tests/user_tasks.py) lies in a folder outside the repository. Its model
is written as a real checkpoint (with the config and sample shape the trainer records),
exported with the export command's function, and loaded back: the same outputs bit for
bit. A bundle whose builder cannot be imported, whose builder fails or returns no
network, or whose recorded config is not one its task takes, is refused, naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import user_tasks

from hpcdp import config as cfgmod
from hpcdp.export import bundle
from hpcdp.export.command import export
from hpcdp.export.load import load
from hpcdp.models import spec as specs
from hpcdp.tasks import rebuild
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust


def write_run(tmp_path: Path, ref: str) -> Path:
    """A checkpoint of the user's task as the trainer writes one: config, shape, weights."""
    cfg = cfgmod.build(None, [f"task.name={ref}", "data.path=/nowhere", "image.num_classes=3",
                              "image.width=5"])
    torch.manual_seed(0)
    entry = rebuild.describe(ref, "tiny_mlp", cfg.to_dict(), {}, [1, 4, 4])
    net = rebuild.build(entry)
    state = {"format": 2, "task": ref, "model_name": "tiny_mlp", "step": 3, "epoch": 0,
             "model": net.state_dict(), "config": cfg.to_dict(), "sample_shape": [1, 4, 4]}
    path = tmp_path / "ckpt" / "step-00000003.pt"
    path.parent.mkdir(mode=0o700)
    ckformat.replace_atomic(path, ckformat.encode(state))
    return path


@pytest.fixture
def ref(tmp_path: Path) -> str:
    return f"{user_tasks.write(tmp_path / 'own')}:TASK"


def test_export_records_the_builder_and_load_rebuilds_it(ref: str, tmp_path: Path) -> None:
    config = export(write_run(tmp_path, ref), tmp_path / "exp")
    model = config["model"]
    assert (config["task"], model["builder"], model["task"], model["name"],
            model["sample_shape"]) == (ref, "task", ref, "tiny_mlp", [1, 4, 4])
    assert model["config"]["image"]["width"] == 5 and model["config"]["task"]["name"] == ref
    assert config["input"]["kind"] == "image" and config["input"]["num_classes"] == 3
    net, _ = load(tmp_path / "exp")
    torch.manual_seed(0)
    again = rebuild.build(model)
    again.load_state_dict(net.state_dict())
    x = torch.randn(6, 1, 4, 4)
    with torch.no_grad():
        assert torch.equal(net(x), again(x))
    state = ckformat.decode(cktrust.read_verified(tmp_path / "ckpt" / "step-00000003.pt"), "ckpt")
    assert all(torch.equal(state["model"][k], v) for k, v in net.state_dict().items())


def edited(folder: Path, change) -> Path:
    """The export `folder` with config.json changed by `change`, the hash kept right."""
    config = json.loads((folder / bundle.CONFIG).read_text())
    change(config)
    (folder / bundle.CONFIG).write_text(json.dumps(config))
    return folder


def test_a_bundle_whose_builder_is_gone_or_broken_is_refused(ref: str, tmp_path: Path) -> None:
    export(write_run(tmp_path, ref), tmp_path / "exp")
    task_file = ref.rpartition(":")[0]
    Path(task_file).rename(tmp_path / "moved.py")
    with pytest.raises(bundle.ExportError) as err:
        load(tmp_path / "exp")
    assert (f"the model's builder, task {ref!r}, cannot be imported: task.name={ref!r}: file "
            f"{task_file} does not exist") in str(err.value)
    broken = user_tasks.write(tmp_path / "own", "broken.py", user_tasks.BROKEN)

    def builder(attr: str):
        def change(config: dict) -> None:
            config["model"]["task"] = f"{broken}:{attr}"
        return change

    for attr, why in [("NOT_MODULE", "returned a dict, not a torch.nn.Module"),
                      ("RAISES", "failed for model 'tiny_mlp': RuntimeError: my builder is "
                       "out of order"),
                      ("build", "build in file")]:
        with pytest.raises(bundle.ExportError, match="builder") as err:
            load(edited(tmp_path / "exp", builder(attr)))
        assert why in str(err.value) and str(broken) in str(err.value)


def test_a_recorded_config_its_task_does_not_take_is_refused(ref: str, tmp_path: Path) -> None:
    export(write_run(tmp_path, ref), tmp_path / "exp")

    def misspelt(config: dict) -> None:
        config["model"]["config"]["image"]["widht"] = 5

    with pytest.raises(bundle.ExportError, match="did you mean 'image.width'"):
        load(edited(tmp_path / "exp", misspelt))


def test_hpcdps_own_networks_keep_their_spec() -> None:
    assert specs.has_spec("image", "digits_cnn") and specs.has_spec("lm", "gpt")
    assert not specs.has_spec("image", "torchvision:resnet18")
    assert not specs.has_spec("/x/mytask.py:TASK", "digits_cnn")  # a user's task: its builder
