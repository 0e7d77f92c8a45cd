"""Extract the `vllm serve` argument table from an installed vLLM's own parser.

Standalone (standard library + vLLM only): it runs inside the interpreter of the environment
where vLLM is installed, either as `scripts/gen-vllm-args` (writes the shipped
data/vllm_args/vllm-X.Y.json) or from `kk3evidence minimize --from-installed`, which runs
this file with the vLLM environment's Python and reads the table from stdout.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
from pathlib import Path
from typing import Any, TypeAlias

# This file runs inside vLLM's interpreter without kk3evidence (capture/vllm_env.py), so it
# keeps its own copy of model.JSONValue/JSONObject.
JSONValue: TypeAlias = "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
JSONObject: TypeAlias = "dict[str, JSONValue]"

SCHEMA = "kk3evidence/vllm-args/v1"

# Defaults that argparse leaves as None because vLLM decides them at start-up from the device
# and usage context (vllm/engine/arg_utils.py). Given so that `--max-num-seqs 256` compares
# equal to an absent flag on the common GPU path; each carries a note saying when it differs.
EFFECTIVE_DEFAULTS: dict[str, tuple[Any, str]] = {
    "max-num-seqs": (
        256,
        "OpenAI server on GPUs < 70 GiB; 1024 on H100/H200/B200-class GPUs; "
        "128 x world size on CPU",
    ),
    "max-num-batched-tokens": (
        2048,
        "OpenAI server on GPUs < 70 GiB; 8192 on H100/H200, 16384 on >= 160 GiB GPUs",
    ),
    "host": (None, "None binds all interfaces (0.0.0.0 / ::)"),
}


def _type_name(t: Any) -> str:
    """Map an argparse `type` callable to int | float | str | json | human_int."""
    if t is None:
        return "str"
    if t in (int, float, str):
        return str(t.__name__)
    name = getattr(t, "__name__", type(t).__name__)
    if name in ("human_readable_int", "human_readable_int_or_auto"):
        return "human_int"
    if name in ("loads", "_parse_type", "parse_dataclass", "union_dict_and_str"):
        return "json"
    if name == "_optional_type":
        for cell in getattr(t, "__closure__", None) or ():
            inner = cell.cell_contents
            if callable(inner):
                return _type_name(inner)
    return "str"


def _jsonable(value: Any) -> tuple[bool, Any]:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (set, frozenset)):
        value = sorted(value, key=str)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False, repr(value)[:200]
    return True, value


def _first_sentence(text: str | None) -> str:
    if not text:
        return ""
    text = " ".join(text.split())
    cut = text.find(". ")
    if 0 < cut < 240:
        return text[: cut + 1]
    return text[:240]


def _registry_names(module: str, attr_candidates: tuple[str, ...]) -> list[str]:
    try:
        mod = __import__(module, fromlist=["x"])
    except Exception:
        return []
    for attr in attr_candidates:
        reg = getattr(mod, attr, None)
        if isinstance(reg, dict):
            return sorted(str(k) for k in reg)
    return []


def _action_kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "bool"
    if isinstance(action, argparse._StoreTrueAction):
        return "store_true"
    if isinstance(action, argparse._StoreFalseAction):
        return "store_false"
    if isinstance(action, argparse._AppendAction):
        return "append"
    return "store_true" if action.nargs == 0 else "store"


def _flag_entry(action: argparse.Action, group: str) -> dict[str, Any]:
    """One option of vLLM's parser as a row of the shipped table."""
    longs = [o for o in action.option_strings if o.startswith("--")]
    negs = [o for o in longs if o.startswith("--no-")]
    names = [o for o in longs if o not in negs] or longs
    primary = names[0][2:]
    kind = _action_kind(action)
    suppressed = action.default == argparse.SUPPRESS
    ok, default = _jsonable(None if suppressed else action.default)
    entry: dict[str, Any] = {
        "name": primary,
        "dest": action.dest,
        "aliases": [o for o in action.option_strings if o not in (names[0], *negs)],
        "negatable": bool(negs),
        "kind": kind,
        "action": type(action).__name__,
        "type": "bool"
        if kind in ("bool", "store_true", "store_false")
        else _type_name(action.type),
        "nargs": action.nargs
        if isinstance(action.nargs, str) or action.nargs is None
        else str(action.nargs),
        "default": default if ok else None,
        "default_known": ok,
        "choices": None,
        "group": group,
        "help": _first_sentence(action.help if action.help != argparse.SUPPRESS else ""),
    }
    if not ok:
        entry["default_repr"] = default
    if action.choices is not None:
        entry["choices"] = [
            c if isinstance(c, (str, int, float)) or c is None else str(c)
            for c in action.choices
        ]
    if primary in EFFECTIVE_DEFAULTS:
        value, note = EFFECTIVE_DEFAULTS[primary]
        entry["effective_default"] = value
        entry["default_note"] = note
    return entry


def extract() -> JSONObject:
    """Return the argument table of the installed vLLM's `vllm serve`."""
    import vllm  # type: ignore[import-not-found]
    from vllm.utils.argparse_utils import (  # type: ignore[import-not-found]
        FlexibleArgumentParser,
    )

    try:
        from vllm.entrypoints.launchers.cli_args import (  # type: ignore[import-not-found]
            make_arg_parser,
        )

        source = "vllm.entrypoints.launchers.cli_args.make_arg_parser"
    except ImportError:  # older layouts
        from vllm.entrypoints.openai.cli_args import (  # type: ignore[import-not-found]
            make_arg_parser,
        )

        source = "vllm.entrypoints.openai.cli_args.make_arg_parser"

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    group_of: dict[int, str] = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            group_of[id(action)] = group.title or ""

    flags: list[dict[str, Any]] = []
    positional: str | None = None
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            positional = action.dest
            continue
        flags.append(_flag_entry(action, group_of.get(id(action), "")))

    flags.sort(key=lambda e: e["name"])
    return {
        "schema": SCHEMA,
        "vllm_version": str(getattr(vllm, "__version__", "unknown")),
        "source": source,
        "generated_by": "scripts/gen-vllm-args",
        "positional": positional,
        "tool_call_parsers": [
            *_registry_names("vllm.tool_parsers", ("_TOOL_PARSERS_TO_REGISTER", "_TOOL_PARSERS"))
        ],
        "reasoning_parsers": [
            *_registry_names(
                "vllm.reasoning", ("_REASONING_PARSERS_TO_REGISTER", "_REASONING_PARSERS")
            )
        ],
        "flags": [*flags],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stdout", action="store_true", help="print the table instead of writing it")
    ap.add_argument(
        "--out-dir", default=str(Path(__file__).resolve().parent.parent / "data" / "vllm_args")
    )
    ns = ap.parse_args(argv)
    table = extract()
    text = json.dumps(table, indent=1, ensure_ascii=False, sort_keys=False) + "\n"
    if ns.stdout:
        sys.stdout.write(text)
        return 0
    version = str(table["vllm_version"])
    major_minor = ".".join(version.split(".")[:2])
    out = Path(ns.out_dir) / f"vllm-{major_minor}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    flags = table["flags"]
    count = len(flags) if isinstance(flags, list) else 0
    print(f"wrote {out} ({count} flags, vLLM {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
