"""``check``, ``report`` and ``diff`` over the bundles of a group (SPEC §5: several bundles of
one group are read as one run).

* check: every node's bundle against the compatibility rules, plus the consistency check across
  the nodes (a difference fails the group: one launch must run one software stack).
* diff: two groups (told apart by their group ids, else the first half of the paths against the
  second), node paired with node by rank; the variables that changed are the union over pairs.
* report: the group analysis in markdown, then the hand-off of the node where the first causal
  failure happened (of node 0 when none failed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kk3evidence.analysis import group as _group
from kk3evidence.errors import EXIT_INCOMPATIBLE, EXIT_OK, EXIT_SEVERAL_CHANGED, UsageError
from kk3evidence.handoff.compat import CheckResult, check
from kk3evidence.handoff.diff import DiffResult, diff
from kk3evidence.model import JSONObject


@dataclass(frozen=True, slots=True)
class GroupCheck:
    nodes: tuple[tuple[str, CheckResult], ...]
    consistency: tuple[dict[str, Any], ...]

    @property
    def exit_code(self) -> int:
        bad = any(r.exit_code != EXIT_OK for _n, r in self.nodes) or bool(self.consistency)
        return EXIT_INCOMPATIBLE if bad else EXIT_OK

    def to_json(self) -> dict[str, object]:
        return {
            "schema": "kk3evidence/group-check/v1",
            "nodes": [{"node": n, **r.to_json()} for n, r in self.nodes],
            "consistency": list(self.consistency),
            "exit_code": self.exit_code,
        }


def check_group(paths: Sequence[str], recipe: str | None = None) -> GroupCheck:
    facts = _group.load_facts(paths)
    results = tuple((f.node, check(f.source, recipe)) for f in facts)
    return GroupCheck(results, tuple(_group.consistency(facts)))


@dataclass(frozen=True, slots=True)
class GroupDiff:
    pairs: tuple[tuple[str, DiffResult], ...]  # (node, diff of that node's two bundles)
    unpaired: tuple[str, ...]

    @property
    def variables(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for _n, d in self.pairs:
            for c in d.variables:
                seen.setdefault(c.label, None)
        return tuple(seen)

    @property
    def exit_code(self) -> int:
        return EXIT_SEVERAL_CHANGED if len(self.variables) > 1 or self.unpaired else EXIT_OK

    def summary(self) -> str:
        names = self.variables
        if self.unpaired:
            return "the groups have different nodes: " + ", ".join(self.unpaired)
        if not names:
            return "no variable changed on any node"
        if len(names) == 1:
            return f"exactly one variable changed: {names[0]}"
        return f"{len(names)} variables changed: " + ", ".join(names)

    def to_json(self) -> JSONObject:
        return {
            "schema": "kk3evidence/group-diff/v1",
            "pairs": [{"node": n, **d.to_json()} for n, d in self.pairs],
            "unpaired": list(self.unpaired),
            "variables": list(self.variables),
            "summary": self.summary(),
            "exit_code": self.exit_code,
        }


def split_groups(paths: Sequence[str]) -> tuple[list[_group.NodeFacts], list[_group.NodeFacts]]:
    facts = _group.load_facts(paths)
    ids = list(dict.fromkeys(f.group_id for f in facts))
    if len(ids) == 2 and None not in ids:
        first = [f for f in facts if f.group_id == ids[0]]
        return first, [f for f in facts if f.group_id == ids[1]]
    if len(facts) % 2:
        raise UsageError(
            "diff of groups: give the bundles of group A then those of group B (as many of "
            "each), or bundles whose manifests name two different groups"
        )
    half = len(facts) // 2
    return facts[:half], facts[half:]


def diff_groups(paths: Sequence[str]) -> GroupDiff:
    a, b = split_groups(paths)
    return _pair(a, b)


def diff_group_sets(a_paths: Sequence[str], b_paths: Sequence[str]) -> GroupDiff:
    """Group A's bundles against group B's, node by node."""
    return _pair(_group.load_facts(a_paths), _group.load_facts(b_paths))


def _pair(a: list[_group.NodeFacts], b: list[_group.NodeFacts]) -> GroupDiff:
    by_node_b = {f.node: f for f in b}
    pairs: list[tuple[str, DiffResult]] = []
    unpaired: list[str] = []
    for fa in a:
        fb = by_node_b.pop(fa.node, None)
        if fb is None:
            unpaired.append(f"{fa.node} only in A")
            continue
        pairs.append((fa.node, diff(fa.source, fb.source)))
    unpaired += [f"{n} only in B" for n in by_node_b]
    return GroupDiff(tuple(pairs), tuple(unpaired))


def report_group(paths: Sequence[str], *, lang: str = "en", recipe: str | None = None) -> str:
    """Markdown: the group analysis, then the hand-off of the node that failed first."""
    from kk3evidence.handoff.report.markdown import render_report

    g = _group.analyze_group(list(paths))
    ff = g.first_failure
    node = next((n for n in g.nodes if ff is not None and n.node == ff.node), g.nodes[0])
    head = _group.render_markdown(g)
    body = render_report(node.source, fmt="markdown", lang=lang, recipe=recipe)  # type: ignore[arg-type]
    return f"{head}\n---\n\n## Hand-off of {node.node} ({node.source})\n\n{body}"
