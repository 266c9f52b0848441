"""Reading time phrases and cron lines at a fixed `now`: what users write becomes the
moment they meant, or a question — never a silently wrong reminder."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from echo_bot.scheduling.crontab import cron_trigger, next_after
from echo_bot.scheduling.timeparse import (
    Recurrence,
    Unclear,
    When,
    describe,
    describe_lateness,
    parse_recurrence,
    parse_when,
)

UTC_ZONE = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")
# Wednesday 10 June 2026, 10:00 UTC
NOW = datetime(2026, 6, 10, 10, 0, tzinfo=UTC)


def when(phrase: str, now: datetime = NOW, zone: ZoneInfo = UTC_ZONE) -> datetime:
    parsed = parse_when(phrase, zone, now, ["en"])
    assert isinstance(parsed, When), f"{phrase!r} → {parsed}"
    return parsed.at


def question(phrase: str, now: datetime = NOW, zone: ZoneInfo = UTC_ZONE) -> str:
    parsed = parse_when(phrase, zone, now, ["en"])
    assert isinstance(parsed, Unclear), f"{phrase!r} → {parsed}"
    return parsed.question


def local(moment: datetime, zone: ZoneInfo = UTC_ZONE) -> tuple[date, int, int]:
    moment = moment.astimezone(zone)
    return moment.date(), moment.hour, moment.minute


# -- one-off phrases from the issue -------------------------------------------------------
def test_in_ten_minutes_is_ten_minutes_from_now() -> None:
    assert when("in 10 minutes") == NOW + timedelta(minutes=10)


def test_at_a_later_time_today_is_today() -> None:
    assert local(when("at 17:30")) == (date(2026, 6, 10), 17, 30)


def test_tomorrow_at_9am() -> None:
    assert local(when("tomorrow at 9am")) == (date(2026, 6, 11), 9, 0)


def test_on_friday_at_noon_is_the_coming_friday() -> None:
    assert local(when("on friday at noon")) == (date(2026, 6, 12), 12, 0)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (datetime(2026, 6, 12, 13, 0, tzinfo=UTC), date(2026, 6, 19)),  # Friday afternoon
        (datetime(2026, 6, 13, 9, 0, tzinfo=UTC), date(2026, 6, 19)),  # Saturday
        (datetime(2026, 6, 14, 23, 0, tzinfo=UTC), date(2026, 6, 19)),  # Sunday night
    ],
)
def test_on_friday_is_never_last_friday(now: datetime, expected: date) -> None:
    at = when("on friday at noon", now)
    assert at > now
    assert local(at) == (expected, 12, 0)
    assert at.weekday() == 4


def test_times_are_read_in_the_given_timezone() -> None:
    at = when("tomorrow at 9am", zone=BERLIN)
    assert at.utcoffset() == timedelta(hours=2)
    assert local(at, BERLIN) == (date(2026, 6, 11), 9, 0)
    assert at.astimezone(UTC).hour == 7


# -- recurrences --------------------------------------------------------------------------
def test_every_weekday_at_8_30_is_a_monday_to_friday_cron() -> None:
    rule = parse_recurrence("every weekday at 8:30")
    assert rule == Recurrence(cron="30 8 * * 1-5", description="every weekday at 08:30")


def test_every_day_at_21_00() -> None:
    rule = parse_recurrence("every day at 21:00")
    assert isinstance(rule, Recurrence)
    assert rule.cron == "0 21 * * *"


@pytest.mark.parametrize(
    "phrase",
    ["every fortnight at 9:00", "every blue moon", "every day at 25:00", "sometimes", ""],
)
def test_unknown_recurrences_are_questions(phrase: str) -> None:
    rule = parse_recurrence(phrase)
    assert isinstance(rule, Unclear)
    assert "could not read a repetition" in rule.question


# -- questions instead of guesses ---------------------------------------------------------
def test_a_time_already_past_today_asks_about_tomorrow() -> None:
    text = question("at 9:00")
    assert "09:00 has already passed today" in text
    assert "tomorrow" in text


def test_a_day_without_a_time_asks_for_the_time() -> None:
    assert question("tomorrow").startswith("At what time tomorrow?")


@pytest.mark.parametrize("phrase", ["blorp", "when pigs fly at 9:00", "at 27:99"])
def test_unparseable_phrases_are_not_guessed(phrase: str) -> None:
    assert "could not read a time" in question(phrase)


@pytest.mark.parametrize(
    ("phrase", "said"),
    [
        ("tomorrow at 24:00", "could not read the time “24:00”"),
        ("tomorrow at 9:75", "could not read the time “9:75”"),
        ("tomorrow at 0am", "could not read the time “0am”"),
        ("monday at 8 30", "could not read a "),  # not Tuesday the 30th at 8:00
        ("tomorrow at 8 30", "could not read a time"),
        ("monday at 9am and tuesday at 10am", "could not read"),
    ],
)
def test_a_time_or_day_dateparser_would_drop_or_bend_is_asked_about(phrase: str, said: str) -> None:
    """dateparser drops a clock it cannot read (keeping the current time of day) or
    takes a stray number for the day of the month: such a reading is never a reminder."""
    text = question(phrase)
    assert said in text and " at 9:00”" not in text.split("Try")[0], text


@pytest.mark.parametrize(
    ("phrase", "expected"),
    [
        ("tomorrow at 9.30", (date(2026, 6, 11), 9, 30)),
        ("tomorrow at 21h", (date(2026, 6, 11), 21, 0)),
        ("tomorrow at 21h30", (date(2026, 6, 11), 21, 30)),
        ("monday at 8:30", (date(2026, 6, 15), 8, 30)),
    ],
)
def test_clocks_written_the_european_way_are_read(
    phrase: str, expected: tuple[date, int, int]
) -> None:
    assert local(when(phrase)) == expected


def test_a_date_in_the_past_is_a_question() -> None:
    assert "is in the past" in question("yesterday at 9:00")


def test_issue28_days_are_written_one_way_without_a_leading_zero() -> None:
    """Issue 28: "Thursday 3 December" (the clock) beside "Thursday 03 December"
    (reminders)."""
    assert question("yesterday at 9:00").startswith("Tuesday 9 June 2026 09:00 is in the past")
    moment = datetime(2026, 12, 3, 13, 22, tzinfo=ZoneInfo("Europe/Berlin"))
    assert describe(moment) == "Thursday 3 December 2026 at 13:22 (Europe/Berlin)"


@pytest.mark.parametrize("phrase", ["in 6 years", "in 10 years", "on 1 January 2040 at 9:00"])
def test_more_than_five_years_ahead_is_refused(phrase: str) -> None:
    assert "more than 5 years" in question(phrase)


def test_four_years_ahead_is_fine() -> None:
    assert when("in 4 years").year == 2030


def test_empty_phrase_asks_when() -> None:
    assert question("   ").startswith("When should I remind you?")


# -- daylight saving time -----------------------------------------------------------------
def test_tomorrow_at_9_stays_9_local_across_the_spring_change() -> None:
    eve = datetime(2026, 3, 28, 11, 0, tzinfo=UTC)  # Saturday 12:00 CET; clocks go forward
    at = when("tomorrow at 9am", eve, BERLIN)
    assert local(at, BERLIN) == (date(2026, 3, 29), 9, 0)
    assert at.utcoffset() == timedelta(hours=2)


def test_tomorrow_at_9_stays_9_local_across_the_autumn_change() -> None:
    eve = datetime(2026, 10, 24, 11, 0, tzinfo=UTC)  # Saturday 13:00 CEST; clocks go back
    at = when("tomorrow at 9am", eve, BERLIN)
    assert local(at, BERLIN) == (date(2026, 10, 25), 9, 0)
    assert at.utcoffset() == timedelta(hours=1)


@pytest.mark.parametrize(
    ("now", "phrase", "elapsed"),
    [
        (datetime(2026, 3, 29, 0, 55, tzinfo=UTC), "in 10 minutes", timedelta(minutes=10)),
        (datetime(2026, 10, 25, 0, 30, tzinfo=UTC), "in 2 hours", timedelta(hours=2)),
        (datetime(2026, 10, 25, 0, 30, tzinfo=UTC), "in an hour", timedelta(hours=1)),
    ],
)
def test_in_minutes_or_hours_is_elapsed_time_across_a_change(
    now: datetime, phrase: str, elapsed: timedelta
) -> None:
    assert when(phrase, now, BERLIN) - now == elapsed


def test_cron_9_local_stays_9_local_across_both_changes() -> None:
    for start, change in (
        (datetime(2026, 3, 26, 12, tzinfo=BERLIN), date(2026, 3, 29)),
        (datetime(2026, 10, 22, 12, tzinfo=BERLIN), date(2026, 10, 25)),
    ):
        moment, seen = start, []
        for _ in range(6):
            nxt = next_after("0 9 * * *", BERLIN, moment)
            assert nxt is not None
            assert (nxt.astimezone(BERLIN).hour, nxt.astimezone(BERLIN).minute) == (9, 0)
            seen.append((nxt.astimezone(BERLIN).date(), nxt.astimezone(UTC).hour))
            moment = nxt
        days = [day for day, _ in seen]
        assert days == [start.date() + timedelta(days=n) for n in range(1, 7)]
        utc_hours = {day: hour for day, hour in seen}
        # The UTC hour moves with the change; the local hour does not.
        assert utc_hours[change - timedelta(days=1)] != utc_hours[change]


# -- crontab weekday numbering ------------------------------------------------------------
def weekdays_of(expression: str, count: int = 14) -> list[int]:
    """ISO weekdays (Mon = 1 … Sun = 7) of the next runs from Monday 1 June 2026."""
    moment = datetime(2026, 6, 1, 0, 0, tzinfo=UTC_ZONE)
    days = []
    for _ in range(count):
        nxt = next_after(expression, UTC_ZONE, moment)
        assert nxt is not None
        days.append(nxt.isoweekday())
        moment = nxt
    return days


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("1-5", {1, 2, 3, 4, 5}),
        ("0", {7}),
        ("7", {7}),
        ("sat,sun", {6, 7}),
        ("SUN", {7}),
        ("mon-fri", {1, 2, 3, 4, 5}),
        ("0-6", {1, 2, 3, 4, 5, 6, 7}),
        ("0-3", {7, 1, 2, 3}),
        ("5-7", {5, 6, 7}),
        ("*/2", {7, 2, 4, 6}),
        ("1,3-4", {1, 3, 4}),
        ("*", {1, 2, 3, 4, 5, 6, 7}),
    ],
)
def test_crontab_weekdays_mean_what_crontab_means(field: str, expected: set[int]) -> None:
    days = weekdays_of(f"0 9 * * {field}")
    assert set(days) == expected


def test_first_weekday_run_is_monday_1_june_2026() -> None:
    nxt = next_after("30 8 * * 1-5", UTC_ZONE, datetime(2026, 5, 30, 12, tzinfo=UTC_ZONE))
    assert nxt == datetime(2026, 6, 1, 8, 30, tzinfo=UTC_ZONE)  # Saturday → Monday
    sunday = next_after("0 9 * * 0", UTC_ZONE, datetime(2026, 6, 1, tzinfo=UTC_ZONE))
    assert sunday == datetime(2026, 6, 7, 9, 0, tzinfo=UTC_ZONE)


def test_day_of_month_and_weekday_together_mean_either_as_in_crontab() -> None:
    # "0 9 1 * 1": on the 1st of each month and on every Monday (crontab's rule).
    moment, runs = datetime(2026, 6, 1, 10, 0, tzinfo=UTC_ZONE), []
    for _ in range(6):
        nxt = next_after("0 9 1 * 1", UTC_ZONE, moment)
        assert nxt is not None
        runs.append(nxt.date())
        moment = nxt
    assert runs == [
        date(2026, 6, 8),
        date(2026, 6, 15),
        date(2026, 6, 22),
        date(2026, 6, 29),
        date(2026, 7, 1),  # a Wednesday: the 1st
        date(2026, 7, 6),
    ]


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("61 * * * *", "61"),
        ("* * * *", "5 fields"),
        ("0 25 * * *", "25"),
        ("0 9 32 * *", "32"),
        ("0 9 * 13 *", "13"),
        ("0 9 * * 8", "out of range"),
        ("0 9 * * 5-1", "backwards"),
        ("0 9 * * funday", "funday"),
        ("0 9 * * */0", "step"),
    ],
)
def test_invalid_cron_expressions_raise_with_a_reason(expression: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        cron_trigger(expression, UTC_ZONE)


def test_lateness_reads_like_a_person_wrote_it() -> None:
    assert describe_lateness(2 * 3600 + 13 * 60) == "2 h 13 min"
    assert describe_lateness(2 * 3600 + 13 * 60 + 59) == "2 h 13 min"
    assert describe_lateness(86400) == "1 d"
    assert describe_lateness(30) == "0 min"
