"""The config reference in docs/ is generated from the dataclasses and kept current."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from hpcdp import config as cfgmod
from hpcdp import config_doc

REPO = Path(__file__).resolve().parents[2]


def test_docs_config_md_is_current() -> None:
    current = (REPO / "docs" / "config.md").read_text()
    assert current == config_doc.reference(), (
        "docs/config.md is stale: run `python -m hpcdp.config_doc > docs/config.md`")


def test_every_key_is_documented() -> None:
    hints = typing.get_type_hints(cfgmod.Config)
    sections = {name: hints[name] for name in cfgmod.SHARED_SECTIONS}
    sections.update({key: s.type for key, (_, s) in config_doc.task_sections().items()})
    assert {"run", "optim", "image", "lm", "recsys"} <= set(sections)
    for name, cls in sections.items():
        docs = config_doc.field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{name}.{f.name} has no comment in its dataclass"


def test_comment_above_a_field_is_its_doc() -> None:
    docs = config_doc.field_docs(cfgmod.HorovodConfig)
    assert "HOROVOD_FUSION_THRESHOLD" in docs["fusion_threshold_mb"]
    assert docs["cycle_time_ms"].startswith("HOROVOD_CYCLE_TIME")
