"""scripts/build-horovod.sh's source patching, run on a small stand-in source tree.

The build itself is exercised by `make test`'s setup on a fresh machine; what
is checked here is that patching is idempotent: a second run over a tree the
first run patched (a retried build) must go on, not stop silently; and that
hpcdp's patches (wake on enqueue, Gloo yielding when busy, the two-rank Gloo
all-reduce) apply to the sources they were made from, each once; and that the PyTorch
library is compiled to the C++ standard torch builds its own extensions with.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-horovod.sh"


WAKE_PATCH = SCRIPT.parent / "horovod-wake-on-enqueue.patch"
GLOO_PATCH = SCRIPT.parent / "gloo-yield-when-busy.patch"
PAIR_PATCH = SCRIPT.parent / "horovod-gloo-pair-allreduce.patch"
#: Horovod's PyTorch library sets its own standard (horovod/torch/CMakeLists.txt).
TORCH_CMAKE = ('if(NOT Pytorch_VERSION VERSION_LESS "1.5.0")\n'
               '    set(CMAKE_CXX_STANDARD {})\nendif()\n')


def _unpatched_sources(patch: str) -> dict[str, str]:
    """Each file the patch touches, as the old side of its hunks in order: what the patch
    expects to find (at other line numbers, which patch and git apply allow)."""
    files: dict[str, list[str]] = {}
    name = None
    for line in patch.splitlines():
        if line.startswith("--- a/"):
            name = line[len("--- a/"):].split("\t")[0]
            files[name] = []
        elif line.startswith(("+++ ", "@@")) or name is None:
            continue
        elif line.startswith((" ", "-")):
            files[name].append(line[1:])
    return {n: "\n".join(lines) + "\n" for n, lines in files.items()}


def _tree(root: Path) -> Path:
    src = root / "horovod-0.28.1"
    (src / "third_party" / "gloo").mkdir(parents=True)
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: horovod\nVersion: 0.28.1\n")
    (src / "CMakeLists.txt").write_text("set(CMAKE_CXX_STANDARD 14)\n")
    (src / "third_party" / "gloo" / "CMakeLists.txt").write_text("set(CMAKE_CXX_STANDARD 14)\n")
    (src / "horovod" / "torch").mkdir(parents=True)
    (src / "horovod" / "torch" / "CMakeLists.txt").write_text(TORCH_CMAKE.format(14))
    for patch in (WAKE_PATCH, GLOO_PATCH, PAIR_PATCH):
        for name, text in _unpatched_sources(patch.read_text()).items():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_text(text)
    return src


def _patch(src: Path, wheels: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SRC": str(src), "PY": sys.executable, "WHEELDIR": str(wheels),
           "GPU_OPS": "none", **extra}
    return subprocess.run(["bash", str(SCRIPT), "--patch-only"], env=env, capture_output=True,
                           text=True, timeout=120)


def test_patching_twice_goes_on(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    for attempt in (1, 2):
        done = _patch(src, tmp_path / "wheels")
        assert done.returncode == 0, f"attempt {attempt}: {done.stdout}{done.stderr}"
        assert "patched" in done.stdout, f"attempt {attempt} stopped before patching"
        for cmake in (src / "CMakeLists.txt", src / "third_party" / "gloo" / "CMakeLists.txt"):
            assert cmake.read_text() == "set(CMAKE_CXX_STANDARD 17)\n"
        operations = (src / "horovod/common/operations.cc").read_text()
        assert operations.count("HOROVOD_WAKE_ON_ENQUEUE") == 1  # applied, and only once
        assert "WaitForQueuedWork" in operations
        pair = (src / "third_party/gloo/gloo/transport/tcp/pair.cc").read_text()
        assert pair.count('"hpcdp-gloo-yield-when-busy-2"') == 1
        assert pair.count("std::this_thread::yield();") == 1
        assert pair.count('"HOROVOD_GLOO_YIELD_WHEN_BUSY"') == 1
        ops = (src / "horovod/common/ops/gloo_operations.cc").read_text()
        assert ops.count('"hpcdp-gloo-pair-allreduce-2"') == 1
        assert ops.count('#include "../gloo/pair_allreduce.h"') == 1
        header = (src / "horovod/common/gloo/pair_allreduce.h").read_text()
        assert header.count("// GLOO_PAIR_ALLREDUCE:") == 1  # created, not appended to
        assert '"HOROVOD_GLOO_PAIR_ALLREDUCE"' in header


def test_stock_applies_no_patch_and_refuses_a_patched_tree(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    pristine = {p: p.read_text() for p in src.rglob("*.cc")}
    done = _patch(src, tmp_path / "wheels", PATCHES="none")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "only (stock Horovod)" in done.stdout
    assert (src / "CMakeLists.txt").read_text() == "set(CMAKE_CXX_STANDARD 17)\n"
    assert {p: p.read_text() for p in src.rglob("*.cc")} == pristine
    assert not (src / "horovod/common/gloo/pair_allreduce.h").exists()
    assert _patch(src, tmp_path / "wheels").returncode == 0  # then hpcdp's patches go in
    again = _patch(src, tmp_path / "wheels", PATCHES="none")
    assert again.returncode != 0 and "already has hpcdp's patches" in again.stderr


def _fake_torch(root: Path, flags: str) -> dict[str, str]:
    """An environment whose `torch` is a stand-in package, its extension builder passing
    `flags`: the script reads the standard from that file without importing torch."""
    (root / "torch" / "utils").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("")
    (root / "torch" / "utils" / "cpp_extension.py").write_text(f"common_cflags = {flags!r}\n")
    return {"PYTHONPATH": str(root)}


@pytest.mark.parametrize(("flags", "std"), [
    ("-std=c++17 -fPIC", 17), ("-std=c++20 -fPIC; -std=c++20", 20), ("-fPIC", 17),
    ("-std=c++14", 17),
])
def test_the_pytorch_library_gets_the_standard_torch_builds_extensions_with(
        tmp_path: Path, flags: str, std: int) -> None:
    src = _tree(tmp_path)
    done = _patch(src, tmp_path / "wheels", **_fake_torch(tmp_path / "site", flags))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"C++17 (C++{std} with torch)" in done.stdout
    assert (src / "horovod/torch/CMakeLists.txt").read_text() == TORCH_CMAKE.format(std)
    assert (src / "CMakeLists.txt").read_text() == "set(CMAKE_CXX_STANDARD 17)\n"


def test_the_pytorch_library_gets_the_standard_asked_for(tmp_path: Path) -> None:
    """TORCH_CXX_STANDARD sets the PyTorch library's standard, and a retried run over a tree
    patched for another standard sets it again; the rest of Horovod stays at 17."""
    src = _tree(tmp_path)
    for std in ("20", "17"):
        done = _patch(src, tmp_path / "wheels", TORCH_CXX_STANDARD=std)
        assert done.returncode == 0, done.stdout + done.stderr
        assert (src / "horovod/torch/CMakeLists.txt").read_text() == TORCH_CMAKE.format(std)
        assert (src / "CMakeLists.txt").read_text() == "set(CMAKE_CXX_STANDARD 17)\n"
    bad = _patch(src, tmp_path / "wheels", TORCH_CXX_STANDARD="14")
    assert bad.returncode != 0 and "TORCH_CXX_STANDARD=14" in bad.stderr


def test_refuses_another_release(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    (src / "PKG-INFO").write_text("Name: horovod\nVersion: 0.27.0\n")
    done = _patch(src, tmp_path / "wheels")
    assert done.returncode != 0
    assert "not the horovod 0.28.1 source release" in done.stderr
    assert (src / "CMakeLists.txt").read_text() == "set(CMAKE_CXX_STANDARD 14)\n"
