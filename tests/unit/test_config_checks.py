"""Each config section's own check, called alone with its values (and the environment
where Horovod reads it), without building a whole config or patching os.environ."""

from __future__ import annotations

import pytest

from hpcdp import config as c
from hpcdp.config import checks

HOROVOD_VARS = {c.CHECK_ENV: "20"}


@pytest.mark.parametrize(("check", "values", "needle"), [
    (checks.check_run, c.RunConfig(epochs=0), "run.epochs=0: must be at least 1"),
    (checks.check_run, c.RunConfig(precision="fp8"), "run.precision='fp8': choose one of"),
    (checks.check_run, c.RunConfig(name="a/b"), "run.name='a/b': must be a plain folder"),
    (checks.check_data, c.DataConfig(), "data.path is not set"),
    (checks.check_data, c.DataConfig(path="/d", prefetch=-1), "data.prefetch=-1: must not be"),
    (checks.check_optim, c.OptimConfig(lr=0.0), "optim.lr=0.0: must be positive"),
    (checks.check_optim, c.OptimConfig(betas=[0.9]), r"optim.betas=\[0.9\]: two numbers"),
    (checks.check_schedule, c.ScheduleConfig(kind="step"), "schedule.kind='step' needs"),
    (checks.check_schedule, c.ScheduleConfig(gamma=0.0), "schedule.gamma=0.0: must be positive"),
    (checks.check_checkpoint, c.CheckpointConfig(keep=0), "checkpoint.keep=0: must be at least"),
    (checks.check_checkpoint, c.CheckpointConfig(resume=""), "checkpoint.resume must not be"),
    (checks.check_preempt, c.PreemptConfig(signals=["KILL"]), "preempt.signals: 'KILL' is not"),
    (checks.check_log, c.LogConfig(every_steps=0), "log.every_steps=0: must be at least 1"),
])
def test_a_section_checks_its_own_values(check, values, needle: str) -> None:
    with pytest.raises(c.ConfigError, match=needle):
        check(values)


def test_each_sections_defaults_pass_its_check() -> None:
    checks.check_run(c.RunConfig())
    checks.check_data(c.DataConfig(path="/d"))
    checks.check_optim(c.OptimConfig())
    checks.check_schedule(c.ScheduleConfig())
    checks.check_horovod(c.HorovodConfig(), {})
    checks.check_checkpoint(c.CheckpointConfig())
    checks.check_preempt(c.PreemptConfig())
    checks.check_log(c.LogConfig())


def test_the_horovod_check_reads_the_environment_it_is_given() -> None:
    shutdown_30 = c.HorovodConfig(stall_shutdown_s=30)
    checks.check_horovod(shutdown_30, HOROVOD_VARS)  # 30 s is above a 20 s check time
    with pytest.raises(c.ConfigError, match=f"below the stall check time \\({c.CHECK_ENV}=45\\)"):
        checks.check_horovod(shutdown_30, {c.CHECK_ENV: "45"})
    with pytest.raises(c.ConfigError, match="below the stall check time \\(Horovod's default"):
        checks.check_horovod(shutdown_30, {})


def test_build_checks_against_the_environment_it_is_handed() -> None:
    """A submission builds the config with the job's variables: the stall check uses
    those, whatever the submitting shell's environment holds."""
    overrides = ["data.path=/data", "horovod.stall_shutdown_s=30"]
    assert c.build(None, overrides, environ=HOROVOD_VARS).horovod.stall_shutdown_s == 30
    with pytest.raises(c.ConfigError, match="horovod.stall_shutdown_s=30 is below"):
        c.build(None, overrides, environ={})


def test_relations_between_sections_are_checked_apart() -> None:
    cfg = c.Config()
    cfg.horovod.op, cfg.run.precision = "adasum", "fp16"
    checks.check_run(cfg.run)  # each section alone is fine
    checks.check_horovod(cfg.horovod, {})
    with pytest.raises(c.ConfigError, match="horovod.op='adasum' cannot be combined with run"):
        checks.check_across_sections(cfg)


def test_the_task_section_is_checked_with_its_own_choices() -> None:
    cfg = c.build(None, ["data.path=/data", "task.name=recsys"])
    cfg.recsys.table_optim = "sgd"
    with pytest.raises(c.ConfigError, match="recsys.table_optim='sgd': choose one of adagrad"):
        checks.check_task_section(cfg)
