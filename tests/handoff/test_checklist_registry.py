"""The checklist is a registry of item functions: one per item of the guide, in its order."""

from __future__ import annotations

from _handoff_fixtures import BASE_ARGV, CPU_FINGERPRINT, fixed_request, launch

from kk3evidence.handoff.evidence import from_dicts
from kk3evidence.handoff.report.checklist import ITEMS, evaluate_checklist
from kk3evidence.handoff.report.i18n import CHECKLIST


def test_every_checklist_title_has_exactly_one_item_function() -> None:
    assert sorted(ITEMS) == sorted(key for key, _en, _ko in CHECKLIST)


def test_items_come_back_in_the_guides_order_with_the_languages_title() -> None:
    ev = from_dicts("a", fingerprint=dict(CPU_FINGERPRINT), launch=launch(list(BASE_ARGV)),
                    requests=[fixed_request()])
    for lang, col in (("en", 1), ("ko", 2)):
        items = evaluate_checklist(ev, lang=lang)  # type: ignore[arg-type]
        assert [i.key for i in items] == [row[0] for row in CHECKLIST]
        assert [i.title for i in items] == [row[col] for row in CHECKLIST]
        assert all(i.status in ("pass", "fail", "unknown") and i.why for i in items)
