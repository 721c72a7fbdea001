"""Suggested standing rules: what the history of decisions supports, never wider than it.

A suggestion is made for an agent and a tool (never "any agent") from the tallies
(:mod:`.tally`): the approvals people made (not a rule's), at least :data:`MIN_APPROVALS` of them,
and no denial or expiry its pattern could match. Its pattern is the narrowest the gate's rules
(:mod:`nexo_django.durable.rules`) can write that covers every approved target:

- a path tool's: the approved paths' common prefix and ``*`` (``/docs/*``), or the one path
  itself; the prefix's ``[``, ``*`` and ``?`` are escaped (``[[]``), so the pattern means the
  prefix literally. A denied or expired path of the same agent and tool whose tally's range of
  targets (least to greatest) reaches the prefix blocks it: a range may be wider than the paths
  in it, so this errs on the side of no suggestion;
- a shell call's: the whole command, approved and never denied (rules match it exactly);
- another tool's: no path, so every approved call and none denied or expired.

Targets no rule can match (kind "other") are neither evidence nor a block. Nothing is applied:
:func:`accept` creates the rule as the admin does (its history records who), :func:`dismiss`
records that a person set one aside, and neither is suggested again.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.contrib.admin.models import ADDITION, LogEntry
from django.db import IntegrityError, connections, router, transaction
from django.db.models import F, Max, Min, Sum
from django.db.models.functions import Collate

from ...models import ApprovalRule, DismissedSuggestion, InsightReviewer, InsightTarget, Verdict
from .. import rules
from .tally import UNTIMED

MIN_APPROVALS = 3
#: candidates looked at (the most approved first): the page stays bounded
MAX_CANDIDATES = 200


@dataclass(frozen=True)
class Suggestion:
    agent: str
    tool: str
    path: str
    kind: str
    approved: int
    reviewers: int
    mean_wait: float
    since: Any

    @property
    def key(self) -> tuple[str, str, str]:
        return self.agent, self.tool, self.path


def escape(text: str) -> str:
    """``text`` as an fnmatch pattern that matches it literally."""
    return "".join(f"[{c}]" if c in "[*?" else c for c in text)


def pattern_for(first: str, last: str) -> str:
    """The narrowest pattern covering every path from ``first`` to ``last`` (least, greatest)."""
    if first == last:
        return escape(first)
    return escape(os.path.commonprefix([first, last])) + "*"


def _reaches(prefix: str, least: str, greatest: str) -> bool:
    """Whether the targets ``least`` to ``greatest`` may hold one that starts with ``prefix``."""
    return greatest >= prefix and (least < prefix or least.startswith(prefix))


def blocked(kind: str, first: str, last: str, denials: list[tuple[str, str, str, str]]) -> bool:
    """Whether a denial (kind, target, least, greatest) of the same agent and tool could match."""
    for d_kind, d_target, d_least, d_greatest in denials:
        if kind == "none":
            return True  # a rule without a path matches every call of the tool
        if kind == "shell" and d_kind == "shell" and d_target == first:
            return True
        if kind == "path" and d_kind == "path":
            if first == last:
                if d_least <= first <= d_greatest:
                    return True
            elif _reaches(os.path.commonprefix([first, last]), d_least, d_greatest):
                return True
    return False


def _by_code_point(field: str) -> Any:
    """``field`` compared by code point, as Python compares (PostgreSQL's default collation may
    not: then the least and greatest would not bound the targets between)."""
    if connections[router.db_for_read(InsightTarget)].vendor == "postgresql":
        return Collate(F(field), "C")
    return F(field)


def suggestions() -> list[Suggestion]:
    """What the history supports, the most approved first (bounded by :data:`MAX_CANDIDATES`)."""
    # The months' rows: all time, a thirtieth of the days'.
    months = InsightTarget.objects.filter(grain="m")
    people = months.exclude(source__in=UNTIMED).exclude(agent="")
    approved = list(
        people.filter(outcome=Verdict.APPROVED, kind__in=("path", "shell", "none"))
        .values("agent", "tool", "kind", "target")
        .annotate(n=Sum("count"), wait=Sum("wait_sum"), first=Min(_by_code_point("first_target")),
                  last=Max(_by_code_point("last_target")), since=Min("day"))
        .filter(n__gte=MIN_APPROVALS).order_by("-n", "agent", "tool", "target")[:MAX_CANDIDATES]
    )
    if not approved:
        return []
    pairs = {(c["agent"], c["tool"]) for c in approved}
    denials: dict[tuple[str, str], list[tuple[str, str, str, str]]] = defaultdict(list)
    for row in (months.exclude(outcome=Verdict.APPROVED)
                .filter(agent__in={a for a, _ in pairs}, tool__in={t for _, t in pairs})
                .values("agent", "tool", "kind", "target")
                .annotate(first=Min(_by_code_point("first_target")), last=Max(_by_code_point("last_target"))).order_by()):
        denials[(row["agent"], row["tool"])].append((row["kind"], row["target"], row["first"], row["last"]))
    reviewers: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for person in (InsightReviewer.objects.filter(agent__in={a for a, _ in pairs}, tool__in={t for _, t in pairs})
                   .values("agent", "tool", "kind", "target").order_by()):
        reviewers[(person["agent"], person["tool"], person["kind"], person["target"])] += 1
    existing = {(r.agent, r.tool, r.path) for r in ApprovalRule.objects.filter(tool__in={t for _, t in pairs})}
    dismissed = set(DismissedSuggestion.objects.filter(tool__in={t for _, t in pairs})
                    .values_list("agent", "tool", "path"))
    out = []
    for c in approved:
        kind, first, last = c["kind"], c["first"], c["last"]
        if blocked(kind, first, last, denials[(c["agent"], c["tool"])]):
            continue
        path = pattern_for(first, last) if kind == "path" else first if kind == "shell" else ""
        key = (c["agent"], c["tool"], path)
        if key in existing or key in dismissed:
            continue
        out.append(Suggestion(agent=c["agent"], tool=c["tool"], path=path, kind=kind, approved=c["n"],
                              reviewers=reviewers[(c["agent"], c["tool"], kind, c["target"])],
                              mean_wait=c["wait"] / c["n"], since=c["since"]))
    return out


def find(agent: str, tool: str, path: str) -> Suggestion | None:
    """The suggestion of that key, if the history still supports it (it is looked at again)."""
    return next((s for s in suggestions() if s.key == (agent, tool, path)), None)


def accept(suggestion: Suggestion, user: Any, *, note: str = "") -> ApprovalRule:
    """Create the suggested rule as the admin creates one: ``created_by`` and ``changed_by`` the
    person (its history, :mod:`..rule_history`, records the creation; with self-approval off it
    approves none of their runs), logged in Django's admin log."""
    rules.validate(suggestion.tool, rules.capability_of(suggestion.tool), suggestion.path)
    with transaction.atomic():
        rule = ApprovalRule.objects.create(
            agent=suggestion.agent, tool=suggestion.tool, path=suggestion.path, verdict=Verdict.APPROVED,
            created_by=user, changed_by=user,
            note=(note or f"suggested: approved {suggestion.approved} times by {suggestion.reviewers} people, "
                  "never denied")[:2000],
        )
        LogEntry.objects.log_actions(user_id=user.pk, queryset=[rule], action_flag=ADDITION,
                                     change_message="Created from a suggested rule (the approvals dashboard).")
    return rule


def dismiss(agent: str, tool: str, path: str, user: Any, *, note: str = "") -> bool:
    """Record that ``user`` set the suggestion aside; False if it was already."""
    try:
        with transaction.atomic():
            DismissedSuggestion.objects.create(agent=agent, tool=tool, path=path, dismissed_by=user, note=note[:2000])
    except IntegrityError:
        return False
    return True
