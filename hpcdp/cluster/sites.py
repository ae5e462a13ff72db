"""Site profiles: one TOML file per cluster with its modules, MPI, network and defaults.

A profile holds what every job on a cluster needs and no job should repeat:
module lines, the venv, srun's MPI plugin and binding, the default partition,
account and QOS, network settings (NCCL, libfabric), a container. `hpcdp slurm
render/submit --site NAME` turn it into render() options; an option given on the
command line beats the profile's (lists add to it, see `merge`).

Where profiles come from, first match wins for a name:
1. `HPCDP_SITE=path/to/NAME.toml` (also chosen when no --site is given);
2. `$XDG_CONFIG_HOME/hpcdp/sites/NAME.toml` (default `~/.config/hpcdp/sites/`);
3. the examples in the checkout's `slurm/sites/`.
Without --site or HPCDP_SITE, a profile whose `clusters` lists the cluster's name
(SLURM_CLUSTER_NAME, else Slurm's ClusterName) is chosen, if any.

Loading validates everything: an unknown key (named with its file and the
closest known one), a value of the wrong type, an unknown site (with the known
ones) raise `SiteError` before a script is rendered or sbatch is called.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcdp.cluster import containers

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

EXAMPLES = Path(__file__).resolve().parents[2] / "slurm" / "sites"

STR, STRS, ENV, TABLE = "a string", "a list of strings", "a table of NAME = value", "a table"
NUM, BOOL, COUNT = "a number not below 0", "true or false", "a positive integer"
# Every key a profile may hold, with its kind; tables nest.
SCHEMA: dict[str, Any] = {
    "description": STR,
    "clusters": STRS,
    "modules": STRS,
    "setup": STRS,
    "venv": STR,
    "sbatch": {"partition": STR, "account": STR, "qos": STR, "constraint": STR,
               "options": STRS},
    "srun": {"mpi": STR, "cpu_bind": STR, "gpu_bind": STR, "options": STRS},
    "env": ENV,
    "container": TABLE,  # checked by hpcdp.cluster.containers
    # The network model `hpcdp plan` predicts with (hpcdp.plan.network); no render() option.
    "network": {"intra_latency_us": NUM, "intra_gbytes_per_s": NUM, "inter_latency_us": NUM,
                "inter_gbytes_per_s": NUM, "reduce_gbytes_per_s": NUM, "hierarchical": BOOL,
                "ranks_per_node": COUNT},
}
# The render() options a profile sets, by profile key.
OPTION = {
    "modules": "modules", "setup": "setup", "venv": "venv", "sbatch.partition": "partition",
    "sbatch.account": "account", "sbatch.qos": "qos", "sbatch.constraint": "constraint",
    "sbatch.options": "sbatch_options", "srun.mpi": "srun_mpi", "srun.options": "srun_options",
    "env": "env", "container": "container",
}
# Options whose lists add up (profile first, the command line after, so that a
# repeated sbatch/srun option takes the command line's value).
LISTS = ("modules", "setup", "sbatch_options", "srun_options")
_BIND = re.compile(r"^[A-Za-z0-9_.:,=+-]+\Z")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


class SiteError(ValueError):
    """A site profile that cannot be found or used."""


def config_dir(environ: Mapping[str, str]) -> Path:
    """Where a user keeps profiles: $XDG_CONFIG_HOME/hpcdp/sites (~/.config by default)."""
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")) / ".config")
    return Path(base).expanduser() / "hpcdp" / "sites"


def known_sites(environ: Mapping[str, str], examples: Path = EXAMPLES) -> dict[str, Path]:
    """Every profile by name, the first found of each name (HPCDP_SITE, config, examples)."""
    found: dict[str, Path] = {}
    named = environ.get("HPCDP_SITE")
    if named:
        found[Path(named).stem] = Path(named)
    for folder in (config_dir(environ), examples):
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                found.setdefault(path.stem, path)
    return found


def _kind_error(where: str, key: str, kind: str, value: object) -> SiteError:
    return SiteError(f"{where}: {key} must be {kind}, got {type(value).__name__} {value!r}")


def _check(where: str, key: str, kind: str, value: object) -> object:
    """One value of the kind SCHEMA says; env values may be integers (sent as text)."""
    if kind == STR:
        if not isinstance(value, str) or not value.strip() or "\n" in value:
            raise _kind_error(where, key, "a non-empty one-line string", value)
    elif kind == STRS:
        if not isinstance(value, list):
            raise _kind_error(where, key, kind, value)
        for i, item in enumerate(value):
            _check(where, f"{key}[{i}]", STR, item)
    elif kind == ENV:
        if not isinstance(value, dict):
            raise _kind_error(where, key, kind, value)
        for name, item in value.items():
            if not _ENV_NAME.match(name):
                raise SiteError(f"{where}: {key}.{name!r} is not a shell variable name")
            if isinstance(item, bool) or not isinstance(item, (str, int)) or "\n" in str(item):
                raise _kind_error(where, f"{key}.{name}", "a one-line string or an integer", item)
        return {name: str(item) for name, item in value.items()}
    elif kind == NUM:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
                or value == float("inf"):
            raise _kind_error(where, key, kind, value)
    elif kind == BOOL:
        if not isinstance(value, bool):
            raise _kind_error(where, key, kind, value)
    elif kind == COUNT:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _kind_error(where, key, kind, value)
    elif not isinstance(value, dict):
        raise _kind_error(where, key, kind, value)
    return value


def validate(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A profile's keys and types, or a SiteError naming the file, the key and the fix."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        kind = SCHEMA.get(key)
        if kind is None:
            raise _unknown_key(where, key, list(SCHEMA))
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                raise _kind_error(where, f"[{key}]", "a table", value)
            for sub, item in value.items():
                if sub not in kind:
                    raise _unknown_key(where, f"{key}.{sub}", [f"{key}.{k}" for k in kind])
                flat[f"{key}.{sub}"] = _check(where, f"{key}.{sub}", kind[sub], item)
        else:
            flat[key] = _check(where, key, kind, value)
    for key in ("srun.cpu_bind", "srun.gpu_bind"):
        if key in flat and not _BIND.match(flat[key]):
            raise SiteError(f"{where}: {key} {flat[key]!r} is not an srun binding like cores")
    if "container" in flat:
        try:
            containers.from_mapping(flat["container"], "container")
        except containers.ContainerError as e:
            raise SiteError(f"{where}: {e}") from None
    return flat


def _unknown_key(where: str, key: str, known: list[str]) -> SiteError:
    near = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return SiteError(f"{where}: unknown key {key!r}{hint} (known: {', '.join(known)})")


def load(path: Path) -> dict[str, Any]:
    """A profile file, validated, as {"key" or "table.key": value}."""
    where = f"site profile {path}"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SiteError(f"{where}: no such file") from None
    except OSError as e:
        raise SiteError(f"{where}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise SiteError(f"{where}: not valid TOML: {e}") from None
    return validate(data, where)


def to_options(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The render() options a profile sets (binding becomes srun options)."""
    opts = {OPTION[key]: value for key, value in profile.items() if key in OPTION}
    binding = [f"--{key[5:].replace('_', '-')}={profile[key]}"
               for key in ("srun.cpu_bind", "srun.gpu_bind") if key in profile]
    if binding:
        opts["srun_options"] = [*binding, *opts.get("srun_options", [])]
    return opts


def merge(site: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The command line's options over a profile's.

    A value given on the command line wins (render()'s defaults for what a profile
    sets are all None, so "given" is "not None"); lists add, the profile's first;
    env adds, the command line's value winning for a name; container settings
    merge field by field (hpcdp.cluster.containers.merge).
    """
    merged = dict(given)
    for name, value in site.items():
        mine = given.get(name)
        if name in LISTS:
            merged[name] = (*value, *(mine or ()))
        elif name == "env":
            merged[name] = {**value, **(mine or {})}
        elif mine is None and name != "container":
            merged[name] = value
    if "container" in site or given.get("container") is not None:
        merged["container"] = containers.merge(site.get("container"), given.get("container"))
    return merged


def cluster_name(environ: Mapping[str, str],
                 ask: Callable[[], str | None] | None = None) -> str | None:
    """The cluster's name: SLURM_CLUSTER_NAME (set in jobs), else Slurm's ClusterName."""
    return environ.get("SLURM_CLUSTER_NAME") or (ask or _scontrol_cluster_name)()


def parse_cluster_name(show_config: str) -> str | None:
    """ClusterName from `scontrol show config` output."""
    m = re.search(r"^ClusterName\s*=\s*(\S+)\s*$", show_config, re.MULTILINE)
    return m[1] if m else None


def _scontrol_cluster_name() -> str | None:
    exe = shutil.which("scontrol")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "show", "config"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_cluster_name(done.stdout) if done.returncode == 0 else None


def choose(site: str | None, environ: Mapping[str, str], examples: Path = EXAMPLES,
           ask: Callable[[], str | None] | None = None) -> tuple[str, Path] | None:
    """The profile to use (name, file), or None: --site, else HPCDP_SITE, else the cluster's."""
    if site == "none":
        return None
    if site is not None:
        if "/" in site or site.endswith(".toml"):
            return Path(site).stem, Path(site)
        known = known_sites(environ, examples)
        if site not in known:
            raise SiteError(_unknown_site(site, known))
        return site, known[site]
    if environ.get("HPCDP_SITE"):
        path = Path(environ["HPCDP_SITE"])
        if not path.is_file():
            raise SiteError(f"HPCDP_SITE={path}: no such file")
        return path.stem, path
    return _by_cluster(environ, examples, ask)


def _unknown_site(site: str, known: Mapping[str, Path]) -> str:
    near = difflib.get_close_matches(site, list(known), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    listed = ", ".join(f"{name} ({path})" for name, path in known.items()) or "none"
    if not _NAME.match(site):
        return f"--site {site!r} is neither a site name nor a .toml file; known: {listed}"
    return f"unknown site {site!r}{hint}; known: {listed}"


def _by_cluster(environ: Mapping[str, str], examples: Path,
                ask: Callable[[], str | None] | None) -> tuple[str, Path] | None:
    """The profile whose `clusters` names this cluster; Slurm is asked only if one could."""
    known = known_sites(environ, examples)
    profiles = {name: load(path) for name, path in known.items()}
    claimed = {name: p["clusters"] for name, p in profiles.items() if p.get("clusters")}
    if not claimed:
        return None
    cluster = cluster_name(environ, ask)
    matches = [name for name, names in claimed.items() if cluster in names]
    if len(matches) > 1:
        raise SiteError(f"cluster {cluster!r} is claimed by several site profiles "
                        f"({', '.join(matches)}); choose one with --site")
    return (matches[0], known[matches[0]]) if matches else None


def apply(site: str | None, given: Mapping[str, Any],
          environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The render() options: the chosen profile's, the command line's on top."""
    chosen = choose(site, os.environ if environ is None else environ)
    return merge(to_options(load(chosen[1])) if chosen else {}, given)


def main(argv: list[str] | None = None) -> int:
    """`python -m hpcdp.cluster.sites`: list the known profiles, or check one (`... NAME`)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args:
            name, path = choose(args[0], os.environ) or ("none", Path())
            profile = load(path) if name != "none" else {}
            for key, value in profile.items():
                print(f"{key} = {value!r}")
            return 0
        for name, path in known_sites(os.environ).items():
            profile = load(path)
            print(f"{name}\t{path}\t{profile.get('description', '')}")
    except SiteError as e:
        print(f"hpcdp sites: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
