"""Questions about time: the valid-time window a question names ("in May 2024", "last
month", "3 months ago", "in 2022", "before March 2024", "last May", "the summer of 2023").

Pure functions, no I/O: :func:`parse_time` reads the question and a reference instant (when
it is asked) and answers a :class:`TimeWindow` or None. Recall uses the window only to
narrow what the database already lets through (``filters.valid_at``), never to widen a
scope (memfabric.recall, docs/recall.md "Questions about time").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["TimeWindow", "parse_time"]

MONTHS = {
    name: n
    for n, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}
NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}  # fmt: skip
# months of each season (northern hemisphere); winter runs into the next year
SEASONS = {"spring": (3, 3), "summer": (6, 3), "autumn": (9, 3), "fall": (9, 3), "winter": (12, 3)}

_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
_NUMBER = r"\d{1,2}|" + "|".join(NUMBERS)
_YEAR = r"(?:19|20)\d{2}"
_SEASON = "|".join(SEASONS)
# "May 2024", "May of 2024", "Mar. 2024", "May, 2024"
_MONTH_YEAR = re.compile(rf"\b({_MONTH})\.?,?\s+(?:of\s+)?({_YEAR})\b")
_SEASON_YEAR = re.compile(rf"\b({_SEASON})\s+(?:of\s+)?({_YEAR})\b")
_LAST_MONTH_NAME = re.compile(rf"\blast\s+({_MONTH})\b")
_AGO = re.compile(rf"\b({_NUMBER})\s+(day|week|month|year)s?\s+ago\b")
_LAST_UNIT = re.compile(r"\b(yesterday|last\s+(?:week|month|year)|this\s+(?:week|month|year))\b")
_YEAR_ONLY = re.compile(
    rf"\b(in|during|of|from|since|before|after|around|until|till|by)\s+({_YEAR})\b"
)
_DIRECTIONS = ("before", "after", "since", "until", "till", "by")
_DIRECTION = re.compile(rf"\b({'|'.join(_DIRECTIONS)})\s*$")


@dataclass(frozen=True)
class TimeWindow:
    """A half-open window of valid time, ``[since, until)``; either end may be open (None).
    ``said`` is the words of the question it was read from."""

    since: datetime | None
    until: datetime | None
    said: str


def _month_start(year: int, month: int) -> datetime:
    year += (month - 1) // 12
    return datetime(year, (month - 1) % 12 + 1, 1, tzinfo=UTC)


def _number(word: str) -> int:
    return int(word) if word.isdigit() else NUMBERS[word]


def _found(question: str, now: datetime) -> tuple[re.Match[str], datetime, datetime] | None:
    """The first time expression of the question and the window it names."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if m := _MONTH_YEAR.search(question):
        start = _month_start(int(m[2]), MONTHS[m[1]])
        return m, start, _month_start(start.year, start.month + 1)
    if m := _SEASON_YEAR.search(question):
        first, length = SEASONS[m[1]]
        start = _month_start(int(m[2]), first)
        return m, start, _month_start(start.year, start.month + length)
    if m := _LAST_MONTH_NAME.search(question):
        month = MONTHS[m[1]]
        year = now.year if month < now.month else now.year - 1
        start = _month_start(year, month)
        return m, start, _month_start(year, month + 1)
    if m := _AGO.search(question):
        n, unit = _number(m[1]), m[2]
        if unit == "day":
            start = day - timedelta(days=n)
            return m, start, start + timedelta(days=1)
        if unit == "week":
            start = day - timedelta(days=day.weekday() + 7 * n)
            return m, start, start + timedelta(days=7)
        if unit == "month":
            start = _month_start(now.year, now.month - n)
            return m, start, _month_start(start.year, start.month + 1)
        return (
            m,
            datetime(now.year - n, 1, 1, tzinfo=UTC),
            datetime(now.year - n + 1, 1, 1, tzinfo=UTC),
        )
    if m := _LAST_UNIT.search(question):
        what = m[1].split()
        if what == ["yesterday"]:
            return m, day - timedelta(days=1), day
        back = 1 if what[0] == "last" else 0
        if what[1] == "week":
            start = day - timedelta(days=day.weekday() + 7 * back)
            return m, start, start + timedelta(days=7)
        if what[1] == "month":
            start = _month_start(now.year, now.month - back)
            return m, start, _month_start(start.year, start.month + 1)
        return (
            m,
            datetime(now.year - back, 1, 1, tzinfo=UTC),
            datetime(now.year - back + 1, 1, 1, tzinfo=UTC),
        )
    if m := _YEAR_ONLY.search(question):
        year = int(m[2])
        return m, datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)
    return None


def parse_time(question: str, now: datetime | None = None) -> TimeWindow | None:
    """The valid-time window the question names, relative to ``now`` (when it is asked,
    default the current time; naive datetimes are taken as UTC), or None when it names
    none. "before X" keeps only the time before X's start, "after"/"since X" the time
    from X's end ("since" from its start). The first time expression of the question
    counts."""
    now = now or datetime.now(UTC)
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    text = question.lower()
    found = _found(text, now)
    if found is None:
        return None
    m, since, until = found
    said = question[m.start() : m.end()]
    lead = _DIRECTION.search(text[: m.start()])
    word = None
    if lead is not None:
        said, word = question[lead.start() : m.end()], lead[1]
    elif m.re is _YEAR_ONLY and m[1] in _DIRECTIONS:
        word = m[1]
    if word is not None:
        if word in ("before", "until", "till", "by"):
            return TimeWindow(None, since if word == "before" else until, said)
        return TimeWindow(since if word == "since" else until, None, said)
    return TimeWindow(since, until, said)
