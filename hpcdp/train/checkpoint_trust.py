"""Who could have written a checkpoint: a resume reads only files no one else could plant.

The checksum of the format (hpcdp.train.checkpoint_format) vouches for completeness,
not for who wrote a file. So, as ssh does with its keys, a checkpoint is resumed only
from a file and folder that no one but their owner (and the group, when
`checkpoint.allow_group_write` says so) can write (`permission_problem`), and a
named file is read only after that check (`read_verified`). See docs/checkpoints.md.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

from hpcdp.train.checkpoint_format import CheckpointError, verify


class UntrustedError(CheckpointError):
    """A checkpoint, or its folder, that someone other than its owner could have written."""


@dataclass(frozen=True)
class Trust:
    """Whose writes a resumed checkpoint may carry (the checkpoint.* keys of these names)."""

    allow_group_write: bool = False  # members of the file's group (one of yours) may write it
    strict_permissions: bool = True  # False: warn about a problem instead of refusing


def permission_problem(mode: int, owner: int, group: int, me: int, my_groups: set[int],
                       private_group: bool, allow_group_write: bool) -> str | None:
    """Why someone other than you (and a trusted group) could write a path, or None (pure).

    The rule ssh applies to its keys: the owner is you or root (an owner can always
    chmod and rewrite), no write bit for others, and none for the group unless the
    group is yours alone (a user private group, `private_group`) or is one of your
    groups and `allow_group_write` trusts it; the members of a trusted group may also
    own the file.
    """
    perms = f"mode {stat.S_IMODE(mode):#o}"
    trusted_group = allow_group_write and group in my_groups
    if owner not in (me, 0) and not trusted_group:
        return f"owned by uid {owner}, not by you (uid {me}) or root"
    if mode & stat.S_IWOTH:
        return f"writable by others ({perms})"
    if mode & stat.S_IWGRP and not (private_group or trusted_group):
        if allow_group_write:
            return f"writable by group gid {group}, which is not one of yours ({perms})"
        return f"writable by its group, gid {group} ({perms})"
    return None


def _private_group(gid: int, owner: int) -> bool:
    """Whether `gid` is the owner's user private group: named after the owner, no one else in it."""
    try:
        user, group = pwd.getpwuid(owner), grp.getgrgid(gid)
    except KeyError:
        return False
    return (group.gr_name == user.pw_name and user.pw_gid == gid
            and set(group.gr_mem) <= {user.pw_name})


def check_trusted(path: Path, trust: Trust, st: os.stat_result | None = None) -> None:
    """Refuse a checkpoint file or folder that others could have written (warn if overridden)."""
    st = os.stat(path) if st is None else st
    problem = permission_problem(
        st.st_mode, st.st_uid, st.st_gid, os.geteuid(), {os.getegid(), *os.getgroups()},
        _private_group(st.st_gid, st.st_uid), trust.allow_group_write)
    if problem is None:
        return
    kind = "checkpoint folder" if stat.S_ISDIR(st.st_mode) else "checkpoint"
    message = (f"{kind} {str(path)!r} is {problem}: whoever can write it can plant a "
               "checkpoint that this run would resume")
    if not trust.strict_permissions:
        warnings.warn(f"{message} (resuming anyway: checkpoint.strict_permissions=false)",
                      stacklevel=2)
        return
    fix = "copy it into a folder of yours" if problem.startswith("owned") else \
        f"chmod go-w {shlex.quote(str(path))}"
    raise UntrustedError(
        f"{message}. Refused; {fix}, or set checkpoint.allow_group_write=true if the group "
        "is trusted, or checkpoint.strict_permissions=false to resume anyway")


# --------------------------------------------------------------------------- reading one


def read_checked(path: Path, name: str, trust: Trust) -> bytes:
    """Open, check who could write the opened file, read, verify the checksum."""
    try:
        with open(path, "rb") as f:
            check_trusted(path, trust, os.fstat(f.fileno()))  # the file read, not a later one
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"checkpoint {name!r} cannot be read: {e}") from None
    verify(data, name)
    return data


def read_verified(path: Path, trust: Trust = Trust()) -> bytes:
    """Read a named checkpoint file, after checking who could write it and its folder."""
    try:
        real = path.resolve(strict=True)
        check_trusted(real.parent, trust)
    except OSError as e:
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {e}") from None
    return read_checked(real, str(path), trust)
