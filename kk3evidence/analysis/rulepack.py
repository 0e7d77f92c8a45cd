"""The rule pack: every shipped rule as one versioned JSON document other tools can embed.

``kk3evidence rules export --format json`` prints it; ``schemas/rule-pack.schema.json`` describes
it. Each rule carries its literal anchors, its grammar as a portable regular expression (see
:func:`~kk3evidence.analysis.grammar.pattern_regex`) next to the mini-language source, the
stage/category/status/since/references, and its example lines together with the *body* the
envelope parser extracts from each (rules match bodies, never whole lines), so an embedder can
check its own envelope handling and regex engine against ours.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kk3evidence._version import __version__
from kk3evidence.analysis.grammar import MAX_MATCH_CHARS, parse_line, pattern_regex
from kk3evidence.analysis.rules import Rule, RuleSet, load_rules
from kk3evidence.model import CATEGORIES, STAGES

__all__ = ["PACK_SCHEMA", "export_pack"]

PACK_SCHEMA = "kk3evidence/rule-pack/v1"

_MATCHING = (
    "A rule looks at the body of a log line: the line with its envelope (vLLM process prefix, "
    "level, timestamp, file:line; NCCL host:pid:tid [dev]; torchrun [rankN]:; collector "
    "wrappers) removed, ANSI codes and carriage-return redraws dropped; each example gives the "
    "body. A line is a candidate when its body contains one of the rule's anchors (rules "
    "without anchors only see the last line of a Python traceback, scope 'exception', or, "
    "scope 'level', an error-level line in a log that states no other failure, or, scope "
    "'cut', the header of a traceback the log ends in, in such a log); "
    "'levels', when present, must contain the line's level; 'sources', when present, must "
    "contain a substring of the source location the envelope names (each example's "
    "'source': NCCL's file.cc:line, glog's file); then one of the regexes must "
    f"match (re.search) within the first {MAX_MATCH_CHARS} characters of the body. When several "
    "rules claim a line: noise, then consequence, then failure, then milestone; higher "
    "priority first; fallback rules last; then the order in this pack. 'when': 'shutdown' "
    "(a noise rule only after a requested stop), 'unready' (a failure only in a log that "
    "never reaches ready: a retry that may still succeed), 'cuda_platform' (a failure only "
    "while no out-of-tree platform plugin is active: a milestone with marks "
    "'foreign_platform' before the line turns it off), 'device_cause' (as 'unready', and the "
    "failure yields to a later one that does not concern the device: one whose category is "
    "not cuda_init or driver_mismatch and whose text names no CUDA, GPU, device, driver or "
    "NVML)."
)
_FLAVOR = (
    "Portable subset: (?:...), (?!...), \\s, \\d, character classes, lazy .*?, numbered "
    "capture groups whose names are listed in 'captures' (no named-group syntax). Works with "
    "Python re, PCRE, Java and ECMAScript; not RE2 (lookahead)."
)


def _example(text: str) -> dict[str, Any]:
    line = parse_line(1, text)
    return {"line": text, "body": line.body, "level": line.level, "source": line.source_file}


def _patterns(rule: Rule) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for src in rule.pattern_sources:
        rx, caps = pattern_regex(src)
        out.append(
            {"source": src, "regex": rx, "anchored": src.startswith("^"), "captures": list(caps)}
        )
    return out


def _rule(rule: Rule) -> dict[str, Any]:
    return {
        "id": rule.id,
        "name": rule.name,
        "kind": rule.kind,
        "stage": rule.stage,
        "category": rule.category,
        "severity": rule.severity,
        "status": rule.status,
        "since": rule.since,
        "references": list(rule.references),
        "summary": rule.summary,
        "why": rule.why,
        "next_steps": list(rule.next_steps),
        "anchors": list(rule.anchors),
        "levels": sorted(rule.levels) if rule.levels is not None else None,
        "sources": list(rule.sources) if rule.sources is not None else None,
        "scope": rule.scope,
        "fallback": rule.fallback,
        "evidence": rule.evidence,
        "priority": rule.priority,
        "consequence_of": sorted(rule.consequence_of) if rule.consequence_of else None,
        "when": rule.when,
        "marks": rule.marks,
        "patterns": _patterns(rule),
        "examples": {
            "match": [_example(t) for t in rule.match],
            "no_match": [_example(t) for t in rule.no_match],
        },
        "file": f"rules/{rule.source}",
    }


def export_pack(ruleset: RuleSet | None = None) -> dict[str, object]:
    """The rule pack (a JSON-ready dict): versioned by the kk3evidence version and by the
    sha256 of its rules, in precedence order."""
    rs = ruleset if ruleset is not None else load_rules()
    rules = [_rule(r) for r in rs.rules]
    digest = hashlib.sha256()
    for r in rs.rules:
        digest.update(repr(sorted(r.raw.items())).encode("utf-8"))
    return {
        "schema": PACK_SCHEMA,
        "version": __version__,
        "rules_sha256": digest.hexdigest(),
        "matching": _MATCHING,
        "regex_flavor": _FLAVOR,
        "stages": list(STAGES),
        "categories": list(CATEGORIES),
        "rules": rules,
    }
