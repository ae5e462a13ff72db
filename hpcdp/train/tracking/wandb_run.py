"""Weights & Biases: offline by default, in the run folder (`hpcdp[wandb]`).

An offline run is written to trackers/wandb/offline-run-*/ and uploaded later from a
node that has a network (`wandb sync`); WANDB_MODE=online (or any mode the user sets)
is left to wandb. The run id is kept in the run folder (hpcdp.train.tracking.state) and
given back to wandb with resume="allow", so every requeue of a job writes to one W&B run.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcdp.train.tracking.records import Record, numbers, scalars


def new_id() -> str:
    """A fresh W&B run id: 8 lowercase letters and digits, as wandb's own are."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(8))


def settled(open_row: list[Record], records: list[Record]) -> tuple[list[Record], list[Record]]:
    """(records wandb has passed on, those of its open row) after logging `records` (pure).

    wandb keeps the row of the last step it was given open in the training process, to
    take more values at that step, and passes it on only when a later step comes (or the
    run finishes): a job killed before then loses that row.
    """
    logged = open_row + records
    if not logged:
        return [], []
    last = max(r.step for r in logged)
    return [r for r in logged if r.step < last], [r for r in logged if r.step == last]


class WandbSink:
    name = "wandb"

    def __init__(self, folder: str, project: str, run_name: str, group: str,
                 config: Mapping[str, Any], mode: str = "") -> None:
        """`mode`: WANDB_MODE as the job has it (empty: offline)."""
        self.folder, self.project, self.run_name = Path(folder), project, run_name
        self.group, self.config, self.mode = group, dict(config), mode or "offline"
        self.run: Any = None
        self.open_row: list[Record] = []  # logged, at the step wandb still holds open

    def open(self, run_id: str | None) -> str:
        import wandb

        self.folder.mkdir(parents=True, exist_ok=True)
        # console="off": wandb must not take over the process's stdout and stderr, which
        # are the job's log; silent: its banner is not hpcdp's to print.
        settings = wandb.Settings(console="off", silent=True)
        self.run = wandb.init(
            dir=str(self.folder), project=self.project, group=self.group or None,
            name=self.run_name, id=run_id or new_id(), resume="allow",
            mode=self.mode, config=self.config, settings=settings)
        return str(self.run.id)

    def log(self, records: list[Record]) -> list[Record]:
        for r in records:
            self.run.log(numbers(r), step=r.step)
        held, self.open_row = settled(self.open_row, records)
        return held

    def log_model(self, folder: Path) -> None:
        import wandb

        artifact = wandb.Artifact(f"{self.run.id}-model", type="model")
        artifact.add_dir(str(folder))
        self.run.log_artifact(artifact)

    def finish(self, summary: Mapping[str, Any] | None, stopped: str | None) -> None:
        if summary is not None:
            self.run.summary.update(scalars(summary))
        # A stopped run is continued by the requeued job under the same id; exit code 0
        # keeps W&B from marking it failed meanwhile.
        self.run.finish(exit_code=0)

