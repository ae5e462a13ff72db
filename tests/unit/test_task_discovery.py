"""Tasks are found by name, by reference or as an installed package's, and own their section.

A user's task lies in a temporary folder outside the repository and is named the ways a
user names it: `path/to/file.py:ATTR` (relative to the config file's folder, or to the
working folder on the command line), `package.module:ATTR` (the folder on sys.path), or
a name an installed package declares under the entry-point group `hpcdp.tasks` (a real
distribution's metadata in a folder on sys.path). tests/parallel/test_user_task.py
trains one; tests/parallel/test_bad_references.py runs the bad ones on 2 ranks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import user_tasks

from hpcdp import config as c
from hpcdp import config_doc, tasks
from hpcdp.config import ConfigError

FORMS = "or a task of your own as package.module:ATTR or path/to/file.py:ATTR"


def build(*overrides: str, path: Path | None = None) -> c.Config:
    return c.build(path, ["data.path=d", *overrides])


def refusal(*overrides: str, path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        build(*overrides, path=path)
    return str(err.value)


@pytest.fixture
def mytask(tmp_path: Path) -> str:
    """The absolute reference of the user's task (tests/user_tasks.py) in tmp/own."""
    return f"{user_tasks.write(tmp_path / 'own')}:TASK"


def test_only_modules_exporting_their_task_are_tasks() -> None:
    assert c.task_names() == ["image", "lm", "recsys"]  # not auc, not recsys_check, not rebuild
    for not_a_task in ("auc", "recsys_check", "rebuild", "video", "__init__", "a.b", ""):
        assert refusal(f"task.name={not_a_task}") == (
            f"task.name={not_a_task!r}: choose one of image, lm, recsys; {FORMS}")


def test_a_file_reference_is_found_and_recorded_absolute(mytask: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = build(f"task.name={mytask}", "image.num_classes=4", "image.width=8")
    assert (cfg.task.name, cfg.model.name, cfg.image.width) == (mytask, "tiny_mlp", 8)
    assert tasks.get(cfg.task.name).name == "mytask"
    assert f'name = "{mytask}"' in c.dumps(cfg)
    # In a config file: relative to the file's folder, whatever the working folder.
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "run.toml").write_text('[task]\nname = "../own/mytask.py:TASK"\n')
    monkeypatch.chdir(conf.parent.parent)
    assert build(path=conf / "run.toml").task.name == mytask
    # On the command line: relative to the working folder.
    monkeypatch.chdir(tmp_path)
    assert build("task.name=own/mytask.py:TASK", path=conf / "run.toml").task.name == mytask
    assert build("task.name=./own/../own/mytask.py:TASK").task.name == mytask


def test_a_module_reference_and_an_installed_task(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    user_tasks.write(tmp_path / "lab" / "vision", "tasks.py")
    (tmp_path / "lab" / "vision" / "__init__.py").write_text("")
    dist = tmp_path / "lab" / "vision_tasks-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vision-tasks\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[hpcdp.tasks]\nmine = vision.tasks:TASK\n"
                                           "lost = vision.tasks:GONE\n")
    monkeypatch.syspath_prepend(str(tmp_path / "lab"))
    try:
        by_module = build("task.name=vision.tasks:TASK")
        assert by_module.task.name == "vision.tasks:TASK" and by_module.model.name == "tiny_mlp"
        installed = build("task.name=mine")
        assert installed.task.name == "mine" and tasks.get("mine") is tasks.get(
            "vision.tasks:TASK")
        assert refusal("task.name=lost") == ("task.name='lost': module 'vision.tasks' has no "
                                             "attribute 'GONE'")
        assert refusal("task.name=other") == ("task.name='other': choose one of image, lm, "
                                              f"recsys (installed: lost, mine); {FORMS}")
        # The generated reference lists hpcdp's own tasks only: the same on every machine.
        assert "one of image, lm, recsys." in config_doc.reference()
    finally:
        sys.modules.pop("vision.tasks", None)
        sys.modules.pop("vision", None)


def test_bad_references_name_the_module_or_file(tmp_path: Path) -> None:
    broken = user_tasks.write(tmp_path, "broken.py", user_tasks.BROKEN)
    failing = user_tasks.write(tmp_path, "failing.py", user_tasks.FAILS_ON_IMPORT)
    table = [
        ("no_such_pkg.tasks:TASK", "module 'no_such_pkg.tasks' cannot be imported: "
         "ModuleNotFoundError: No module named 'no_such_pkg'"),
        (f"{tmp_path}/nope.py:TASK", f"file {tmp_path}/nope.py does not exist"),
        (f"{broken}:TASKK", f"file {broken} has no attribute 'TASKK' (did you mean 'TASK'?)"),
        (f"{broken}:build", f"build in file {broken} is a function, not a hpcdp.tasks.Task"),
        (f"{failing}:TASK", f"file {failing} cannot be imported: ZeroDivisionError: division "
         "by zero"),
        ("hpcdp.tasks.image:MODELS", "MODELS in module 'hpcdp.tasks.image' is a dict, not a "
         "hpcdp.tasks.Task"),
        ("image:", "not a reference; write package.module:ATTR or path/to/file.py:ATTR"),
        ("a-b:TASK", "not a reference; write package.module:ATTR or path/to/file.py:ATTR"),
    ]
    for reference, message in table:
        assert refusal(f"task.name={reference}") == f"task.name={reference!r}: {message}"


@pytest.mark.parametrize("overrides", [
    ("image.num_classes=0",), ("image.width=-1",), ("image.scale=0",), ('image.x_name=""',),
    ("image.widht=2",), ("image.width=2.5",), ("data.x_name=a",), ("model.num_classes=3",),
    ("lm.layers=2",), ("recsys.embed_dim=4",),
])
def test_a_users_task_refuses_what_the_image_task_refuses(mytask: str,
                                                         overrides: tuple[str, ...]) -> None:
    message = refusal(*overrides)
    assert refusal(f"task.name={mytask}", *overrides) == message.replace(
        "task is 'image'", f"task is {mytask!r}")


@pytest.mark.parametrize("overrides", [
    ("image.num_classes=1",), ("image.width=0", "image.cifar_stem=true"), ("image.std=0.5",),
])
def test_a_users_task_accepts_what_the_image_task_accepts(mytask: str,
                                                         overrides: tuple[str, ...]) -> None:
    image, own = build(*overrides), build(f"task.name={mytask}", *overrides)
    assert own.to_dict()["image"] == image.to_dict()["image"]


OWN_SECTION = '''\
from dataclasses import dataclass, replace

from hpcdp.config import ConfigError, TaskSection
from hpcdp.tasks import image


@dataclass
class WaveConfig:
    """My task's own section."""

    bands: int = 4  # frequency bands
    window: str = "hann"  # hann | flat


def check(cfg):
    if cfg.wave.bands < 1:
        raise ConfigError("wave.bands must be at least 1")


TASK = replace(image.TASK, name="wave", defaults={"wave": {"bands": 8}},
               section=TaskSection("wave", WaveConfig, check, {"window": ("hann", "flat")}))
'''


def test_a_users_own_section_is_checked_like_a_built_in_one(tmp_path: Path) -> None:
    ref = f"{user_tasks.write(tmp_path, 'wave.py', OWN_SECTION)}:TASK"
    cfg = build(f"task.name={ref}")
    assert (cfg.wave.bands, cfg.wave.window) == (8, "hann")  # its defaults apply
    assert "[wave]\nbands = 8" in c.dumps(cfg)
    assert refusal(f"task.name={ref}", "wave.band=2").startswith(
        "unknown key 'wave.band' in override 'wave.band=2' (did you mean 'wave.bands'?)")
    assert refusal(f"task.name={ref}", "wave.bands=2.5") == (
        "wave.bands: expected int, got float 2.5")
    assert refusal(f"task.name={ref}", "wave.window=box") == (
        "wave.window='box': choose one of hann, flat")
    assert refusal(f"task.name={ref}", "wave.bands=0") == "wave.bands must be at least 1"
    assert refusal(f"task.name={ref}", "image.width=2") == (
        "image.width in override 'image.width=2': [image] is the section of task 'image', "
        f"and this config's task is {ref!r} (task.name)")


def test_a_recorded_config_is_rebuilt_without_its_paths(mytask: str) -> None:
    cfg = build(f"task.name={mytask}", "image.num_classes=4", "data.path=/nowhere/at/all")
    again = c.from_record(cfg.to_dict(), "a record")
    assert again.to_dict() == cfg.to_dict()
    record = cfg.to_dict()
    record["image"]["widht"] = 3
    with pytest.raises(ConfigError, match="did you mean 'image.width'"):
        c.from_record(record, "a record")


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


def test_the_reference_lists_every_tasks_section_once() -> None:
    text = config_doc.reference()
    assert text.count("## [image]") == 1 and "## [lm]" in text and "## [recsys]" in text
