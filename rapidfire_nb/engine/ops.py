"""The one table of IC op rules: for an op and a run's (projected) status, allowed or the refusal.

The rules live in ``ops_rules.json`` beside this file, so that the panel's buttons are checked
against the same data (js/test/ops_rules.test.ts), as the event schema is. Three places use them:
the facade validates an op against the run as the queued ops will leave it (experiment.py), the
queue projects that state by replaying queued ops with ``leaves`` (queued.py), and the controller
re-checks each op when it applies it (a run may have finished meanwhile). Checks that need more
than a status (a warm start's weights, a clone's changes) stay with the code that has the facts.
"""

from __future__ import annotations

import json
from pathlib import Path

RULES_PATH = Path(__file__).with_name("ops_rules.json")
RULES: dict = json.loads(RULES_PATH.read_text(encoding="utf-8"))
OPS: tuple[str, ...] = tuple(RULES["ops"])
STATUSES: tuple[str, ...] = tuple(RULES["statuses"])


def _rule(op: str) -> dict:
    try:
        return RULES["ops"][op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; ops are {', '.join(OPS)}") from None


def allowed(op: str, status: str) -> bool:
    """True when ``op`` may be applied to a run whose (projected) status is ``status``."""
    return status in _rule(op)["allowed"]


def refusal(op: str, status: str, run_id: int, is_now: str | None = None) -> str | None:
    """None when allowed, else the reason the op is refused, as the user reads it. ``is_now``
    says where the run stands ("is stopped", or "is stopping (...)" while a queued op makes the
    difference); default "is <status>"."""
    if allowed(op, status):
        return None
    return _rule(op)["refusal"].format(run_id=run_id, status=status,
                                       is_now=is_now or f"is {status}")


def leaves(op: str, status: str) -> str:
    """The status a run is left in once ``op`` is applied to it (unchanged when refused)."""
    rule = _rule(op)
    if status not in rule["allowed"] or rule["leaves"] is None:
        return status
    return rule["leaves"]
