"""The package's public surface: every name in __all__ resolves, and importing stays light."""

from __future__ import annotations

import subprocess
import sys

import kk3evidence


def test_every_public_name_resolves() -> None:
    for name in kk3evidence.__all__:
        assert getattr(kk3evidence, name) is not None, name


def test_all_names_are_unique() -> None:
    # Order is checked by ruff (RUF022, isort-style sorting).
    names = list(kk3evidence.__all__)
    assert len(names) == len(set(names))


def test_all_is_exactly_the_lazy_table_and_the_eager_names() -> None:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(kk3evidence))
    eager = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module != "__future__"
        for alias in node.names
        if node.module not in ("typing",)
    }
    assert set(kk3evidence.__all__) == eager | set(kk3evidence._LAZY)


def test_lazy_names_point_into_the_layer_packages() -> None:
    for name, (module, attr) in kk3evidence._LAZY.items():
        top = module.split(".")[0]
        assert top in {"analysis", "bundle", "capture", "handoff", "vllm_args"}, (name, module)
        assert attr


def test_unknown_attribute_raises_attribute_error() -> None:
    try:
        kk3evidence.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as err:
        assert "no_such_name" in str(err)
    else:
        raise AssertionError("expected AttributeError")


def test_import_does_not_load_heavy_dependencies() -> None:
    code = (
        "import sys, kk3evidence; "
        "print(','.join(m for m in ('polars', 'httpx', 'pyparsing', 'pynvml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_library_round_trip_on_the_shipped_example(repo_root) -> None:  # type: ignore[no-untyped-def]
    example = repo_root / "examples" / "bundles" / "weights-missing.tar.gz"
    assert kk3evidence.validate(example) == []
    result = kk3evidence.analyze(example)
    assert result.first_failure is not None
    first = result.first_failure
    assert (first.stage, first.category) == ("weights_access", "weights")
    with kk3evidence.open_bundle(example) as bundle:
        assert bundle.launch is not None and bundle.launch["exit_code"] == 1
