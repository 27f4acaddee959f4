"""Questions about time read into valid-time windows (memfabric.timeparse)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memfabric.timeparse import parse_time

NOW = datetime(2024, 11, 20, 18, 30, tzinfo=UTC)


def at(*ymd: int) -> datetime:
    return datetime(*ymd, tzinfo=UTC)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("question", "since", "until", "said"),
    [
        ("What did Tom say about work in May 2024?", at(2024, 5, 1), at(2024, 6, 1), "May 2024"),
        (
            "During April of 2024, what did she say?",
            at(2024, 4, 1),
            at(2024, 5, 1),
            "April of 2024",
        ),
        ("her news around Mar. 2024", at(2024, 3, 1), at(2024, 4, 1), "Mar. 2024"),
        ("in december 2023, where did he live?", at(2023, 12, 1), at(2024, 1, 1), "december 2023"),
        ("What did Maria say last month?", at(2024, 10, 1), at(2024, 11, 1), "last month"),
        ("what did he say 3 months ago", at(2024, 8, 1), at(2024, 9, 1), "3 months ago"),
        ("what did he say two months ago", at(2024, 9, 1), at(2024, 10, 1), "two months ago"),
        ("Where did they go last May?", at(2024, 5, 1), at(2024, 6, 1), "last May"),
        ("Where did they go last December?", at(2023, 12, 1), at(2024, 1, 1), "last December"),
        ("What happened in 2022?", at(2022, 1, 1), at(2023, 1, 1), "in 2022"),
        ("plans for the summer of 2023", at(2023, 6, 1), at(2023, 9, 1), "summer of 2023"),
        ("the winter 2023 trip", at(2023, 12, 1), at(2024, 3, 1), "winter 2023"),
        ("What did she say yesterday?", at(2024, 11, 19), at(2024, 11, 20), "yesterday"),
        ("what did I say last week", at(2024, 11, 11), at(2024, 11, 18), "last week"),
        ("and 2 weeks ago?", at(2024, 11, 4), at(2024, 11, 11), "2 weeks ago"),
        ("anything 10 days ago", at(2024, 11, 10), at(2024, 11, 11), "10 days ago"),
        ("what did he do last year", at(2023, 1, 1), at(2024, 1, 1), "last year"),
        ("what did he do this year", at(2024, 1, 1), at(2025, 1, 1), "this year"),
    ],
)
def test_a_named_time_is_read_as_its_window(
    question: str, since: datetime, until: datetime, said: str
) -> None:
    window = parse_time(question, NOW)
    assert window is not None
    assert (window.since, window.until, window.said) == (since, until, said)


@pytest.mark.parametrize(
    ("question", "since", "until", "said"),
    [
        ("Where did Maria live before March 2024?", None, at(2024, 3, 1), "before March 2024"),
        ("What did he do after May 2024?", at(2024, 6, 1), None, "after May 2024"),
        ("What has he done since May 2024?", at(2024, 5, 1), None, "since May 2024"),
        ("what changed before 2023", None, at(2023, 1, 1), "before 2023"),
        ("by last month, where was she?", None, at(2024, 11, 1), "by last month"),
    ],
)
def test_before_after_and_since_keep_one_side(
    question: str, since: datetime | None, until: datetime | None, said: str
) -> None:
    window = parse_time(question, NOW)
    assert window is not None
    assert (window.since, window.until, window.said) == (since, until, said)


@pytest.mark.parametrize(
    "question",
    [
        "What's Tom's current job?",
        "Where did Maria live before moving to Porto?",
        "Which city is Nadia's employer in?",
        "What does May like to eat?",  # a name, not a month: no year beside it
        "Who ran 5 km in the race?",
        "room 2024 is booked",
        "",
    ],
)
def test_a_question_without_a_time_has_no_window(question: str) -> None:
    assert parse_time(question, NOW) is None


def test_relative_times_count_from_when_the_question_is_asked() -> None:
    early = parse_time("what did she say last month", at(2024, 1, 15))
    assert early is not None and (early.since, early.until) == (at(2023, 12, 1), at(2024, 1, 1))
    naive = parse_time("last month", datetime(2024, 1, 15))  # naive: taken as UTC
    assert naive is not None and naive.until == at(2024, 1, 1)
