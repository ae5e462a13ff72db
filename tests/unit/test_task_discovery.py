"""Tasks are found by name and own their config section: a new workload is one new module.

The copy of hpcdp/tasks/image.py with only its task name changed lies in a temporary
folder added to the hpcdp.tasks package's search path, so that no file of the tree
changes and no other test sees the extra task. tests/parallel/test_new_task.py trains it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hpcdp.tasks
from hpcdp import config as c
from hpcdp import config_doc, tasks
from hpcdp.config import ConfigError

TASKS = Path(hpcdp.tasks.__file__).parent
NEW = "imagecopy"


def copy_image_task(folder: Path, name: str) -> Path:
    """hpcdp/tasks/image.py saved as `name`.py with only the task's name changed."""
    source = (TASKS / "image.py").read_text()
    assert source.count('name="image",') == 1
    path = folder / f"{name}.py"
    path.write_text(source.replace('name="image",', f'name="{name}",'))
    return path


@pytest.fixture
def new_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    copy_image_task(tmp_path, NEW)
    monkeypatch.setattr(hpcdp.tasks, "__path__", [*hpcdp.tasks.__path__, str(tmp_path)])
    yield NEW
    sys.modules.pop(f"hpcdp.tasks.{NEW}", None)


def build(*overrides: str) -> c.Config:
    return c.build(None, ["data.path=d", *overrides])


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        build(*overrides)
    return str(err.value)


def test_only_modules_exporting_their_task_are_tasks() -> None:
    assert c.task_names() == ["image", "lm", "recsys"]  # not auc, not recsys_check
    for not_a_task in ("auc", "recsys_check", "video", "__init__", "a.b", ""):
        assert refusal(f"task.name={not_a_task}") == (
            f"task.name={not_a_task!r}: choose one of image, lm, recsys")


def test_a_copy_of_the_image_task_is_found_by_name(new_task: str) -> None:
    assert c.task_names() == ["image", NEW, "lm", "recsys"]
    assert tasks.get(new_task).name == new_task
    cfg = build(f"task.name={new_task}", "image.num_classes=4", "image.width=8")
    assert (cfg.task.name, cfg.image.num_classes, cfg.image.width) == (new_task, 4, 8)
    assert type(cfg.image).__module__ == f"hpcdp.tasks.{new_task}"
    assert "[image]\nx_name = \"x\"" in c.dumps(cfg)


@pytest.mark.parametrize("overrides", [
    ("image.num_classes=0",), ("image.width=-1",), ("image.scale=0",), ('image.x_name=""',),
    ("image.widht=2",), ("image.width=2.5",), ("data.x_name=a",), ("model.num_classes=3",),
    ("lm.layers=2",), ("recsys.embed_dim=4",),
])
def test_the_copy_refuses_what_the_image_task_refuses(new_task: str,
                                                      overrides: tuple[str, ...]) -> None:
    message = refusal(*overrides)
    assert refusal(f"task.name={new_task}", *overrides) == message.replace(
        "task is 'image'", f"task is {new_task!r}")


@pytest.mark.parametrize("overrides", [
    ("image.num_classes=1",), ("image.width=0", "image.cifar_stem=true"), ("image.std=0.5",),
])
def test_the_copy_accepts_what_the_image_task_accepts(new_task: str,
                                                      overrides: tuple[str, ...]) -> None:
    image, copy = build(*overrides), build(f"task.name={new_task}", *overrides)
    assert copy.to_dict()["image"] == image.to_dict()["image"]


def test_a_section_of_another_task_names_its_task() -> None:
    assert refusal("lm.layers=2") == ("lm.layers in override 'lm.layers=2': [lm] is the "
                                      "section of task 'lm', and this config's task is 'image' "
                                      "(task.name)")
    assert refusal("task.name=lm", "image.width=2").startswith(
        "image.width in override 'image.width=2': [image] is the section of task 'image'")
    assert refusal("imag.width=2") == (
        "unknown section 'imag' in override 'imag.width=2' (did you mean 'image'?); known: "
        "run, task, data, model, image, optim, schedule, horovod, checkpoint, preempt, log")
    assert "recsys" not in build("task.name=lm").sections()


def test_a_hand_made_config_reads_its_tasks_section() -> None:
    cfg = c.Config()
    assert cfg.image.num_classes == "auto" and cfg.to_dict()["image"]["x_name"] == "x"
    with pytest.raises(AttributeError, match="no section 'lm'"):
        cfg.lm  # noqa: B018


def test_the_reference_lists_every_tasks_section_once(new_task: str) -> None:
    text = config_doc.reference()
    assert text.count("## [image]") == 1 and "## [lm]" in text and "## [recsys]" in text
    assert "one of image, imagecopy, lm, recsys." in text
