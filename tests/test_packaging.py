"""The wheel carries rules/ and schemas/ and works outside the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        check=True,
    )
    (whl,) = out.glob("kk3evidence-*.whl")
    return whl


def test_wheel_ships_rules_and_schemas(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("kk3evidence/_data/rules/") and n.endswith(".toml") for n in names)
    assert any(n.startswith("kk3evidence/_data/schemas/") and n.endswith(".json") for n in names)
    assert any(n.startswith("kk3evidence/_data/data/vllm_args/") for n in names)
    assert "kk3evidence/_data/data/flag-classes.toml" in names
    assert "kk3evidence/py.typed" in names


@pytest.mark.slow
def test_installed_wheel_runs_outside_the_repository(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # A fresh venv with the wheel and its declared dependencies, nothing from the checkout.
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONSAFEPATH"] = "1"
    probe = (
        "import kk3evidence, pathlib; from kk3evidence._resources import data_dir; "
        "d = data_dir('rules'); print(kk3evidence.__file__); print(d); "
        "assert 'site-packages' in str(d), d"
    )
    proc = subprocess.run([str(py), "-c", probe], cwd=work, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert str(REPO) not in proc.stdout.splitlines()[0]
    cli = subprocess.run(
        [str(venv / "bin" / "kk3evidence"), "--version"],
        cwd=work, env=env, capture_output=True, text=True,
    )
    assert cli.returncode == 0, cli.stderr
    _slim_install_works(venv, work, env)


def _slim_install_works(venv: Path, work: Path, env: dict[str, str]) -> None:
    """The plain install has no polars: capture, analyze and validate work; compare says what
    to install (issue 9: a sidecar in a vLLM image should not carry 170 MB of polars)."""
    py, kk = str(venv / "bin" / "python"), str(venv / "bin" / "kk3evidence")
    has_polars = subprocess.run([py, "-c", "import polars"], capture_output=True, env=env)
    assert has_polars.returncode != 0, "polars must be an optional extra"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kk, *args], cwd=work, env=env, capture_output=True, text=True)

    bundle = work / "run.tar"
    cap = run("capture", "-o", str(bundle), "--", py, "-c", "print('hello')")
    assert cap.returncode == 0, cap.stderr
    assert run("validate", str(bundle)).returncode == 0
    example = REPO / "examples" / "bundles" / "weights-missing.tar.gz"
    ana = run("analyze", str(example))
    assert ana.returncode == 3, ana.stderr
    cmp_ = run("compare", str(example))
    assert cmp_.returncode == 2
    assert "pip install 'kk3evidence[compare]'" in cmp_.stderr
