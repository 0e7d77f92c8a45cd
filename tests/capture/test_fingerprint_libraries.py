"""Loaded-library scan of /proc/PID/maps: a real process tree, file-name versions, wheels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from kk3evidence.capture.procscan import (
    LibraryScanner,
    classify_library,
    group_members,
    mapped_objects,
    process_tree,
    scan_libraries,
    wheel_version,
)

# A child that loads libm through ctypes and starts a grandchild that does the same.
CHILD = (
    "import ctypes, ctypes.util, subprocess, sys\n"
    "ctypes.CDLL(ctypes.util.find_library('m'))\n"
    "g = subprocess.Popen([sys.executable, '-c', "
    "\"import ctypes,ctypes.util,sys; ctypes.CDLL(ctypes.util.find_library('m')); "
    "print('g', flush=True); sys.stdin.read()\"], stdin=subprocess.PIPE, stdout=sys.stdout)\n"
    "print('ready', g.pid, flush=True)\n"
    "sys.stdin.read()\n"
    "g.stdin.close(); g.wait()\n"
)


def test_scan_finds_libraries_mapped_by_the_child_and_grandchild() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        first = proc.stdout.readline()
        second = proc.stdout.readline()
        line = first if first.startswith("ready") else second
        gpid = int(line.split()[1])
        tree = process_tree(proc.pid)
        assert proc.pid in tree and gpid in tree
        scanner = LibraryScanner(proc.pid, names=("libm",))
        scanner.scan_once()
        libs = scanner.libraries()
        assert [lib.name for lib in libs] == ["libm"]
        assert set(libs[0].pids) == {proc.pid, gpid}
        assert libs[0].version is not None  # libm.so.6
    finally:
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()


def test_scanner_thread_collects_until_stopped() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        proc.stdout.readline()
        proc.stdout.readline()
        scanner = LibraryScanner(proc.pid, interval=0.05, names=("libm",))
        scanner.start()
        while scanner.scans < 2:
            scanner._stop.wait(0.01)
        scanner.stop()
        assert scanner.libraries()
    finally:
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()


def test_group_members_skip_other_groups() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        process_group=0,
    )
    try:
        assert group_members(proc.pid) == [proc.pid]
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)
    assert group_members(proc.pid) == []


MAPS = """\
7f0000000000-7f0000001000 r-xp 00000000 08:01 123 /usr/lib/x86_64/libcuda.so.580.65.06
7f0000001000-7f0000002000 r--p 00000000 08:01 124 /v/site-packages/nvidia/nccl/lib/libnccl.so.2
7f0000002000-7f0000003000 r--p 00000000 08:01 125 /v/site-packages/torch/lib/libtorch_cuda.so
7f0000003000-7f0000004000 r--p 00000000 08:01 126 /usr/cuda/lib64/libcudart.so.13.0.48 (deleted)
7f0000004000-7f0000005000 rw-p 00000000 00:00 0 [heap]
7f0000005000-7f0000006000 r--p 00000000 08:01 127 /usr/lib/libc.so.6
"""


def test_fake_proc_tree_and_versions_from_names_and_wheels(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    (site / "nvidia_nccl_cu13-2.27.7.dist-info").mkdir()
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "torch-2.11.0+cu130.dist-info").mkdir()
    maps = MAPS.replace("/v/site-packages", str(site))
    found = scan_libraries([1, 2], read_maps=lambda pid: maps if pid == 1 else None)
    assert set(found) == {
        "/usr/lib/x86_64/libcuda.so.580.65.06",
        f"{site}/nvidia/nccl/lib/libnccl.so.2",
        f"{site}/torch/lib/libtorch_cuda.so",
        "/usr/cuda/lib64/libcudart.so.13.0.48",
    }
    scanner = LibraryScanner(
        1, read_maps=lambda pid: maps if pid == 1 else None, proc_root=str(tmp_path / "noproc")
    )
    scanner.scan_once()
    libs = {lib.name: lib for lib in scanner.libraries()}
    assert libs["libcuda"].version == "580.65.06"
    assert libs["libnccl"].version == "2.27.7"
    assert libs["libtorch_cuda"].version == "2.11.0+cu130"
    assert libs["libcudart"].version == "13.0.48"
    assert wheel_version("/usr/lib/libfoo.so") is None


def test_classify_library_names() -> None:
    assert classify_library("/x/libcublasLt.so.13") == ("libcublasLt", "13")
    assert classify_library("/x/libnvidia-ml.so.1") == ("libnvidia-ml", "1")
    assert classify_library("/x/libgomp-a34b3233.so.1", ("libgomp",)) == ("libgomp", "1")
    assert classify_library("/x/libcudart_static.a") is None
    assert classify_library("/x/libcudnn_ops.so.9") is None


@given(st.text())
def test_maps_parsing_never_raises(text: str) -> None:
    for path in mapped_objects(text):
        assert path.startswith("/") and ".so" in path
        classify_library(path)


def test_cuda13_wheels_sharing_one_lib_folder_get_their_wheel_version(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (site / "nvidia_cublas-13.1.0.3.dist-info").mkdir()
    (site / "nvidia_cuda_runtime-13.0.96.dist-info").mkdir()
    lib = site / "nvidia" / "cu13" / "lib"
    assert wheel_version(str(lib / "libcublas.so.13")) == "13.1.0.3"
    assert wheel_version(str(lib / "libcublasLt.so.13")) == "13.1.0.3"
    assert wheel_version(str(lib / "libcudart.so.13")) == "13.0.96"
    assert wheel_version(str(lib / "libnvrtc.so.13")) is None
