"""Schedules' values, with no SQL: a schedule's declaration (``ScheduleSpec``) and
the arithmetic of its ticks. The protocol (``protocol/schedules.py``) keeps them in the database
and fires them, one run per tick across every worker on every host.

Ticks come from cronsim (a well-kept cron library: Debian cron's rules, including what it does
when daylight saving time skips or repeats an hour) in the schedule's time zone (``zoneinfo``).
An expression has five fields (minute hour day month weekday) or six, with seconds first
(``"* * * * * *"``: every second).

A tick is due once the clock passed it. ``catch_up`` says what a firer does with the ticks that
came due while nobody fired (every worker was down, say):

- ``"skip"``: only the newest due tick runs, and only if it is at most ``ON_TIME`` seconds old;
  the older ones are skipped;
- ``"one"``: the newest due tick runs, however old: one run stands for all the missed ones;
- ``"all"``: every due tick runs, the newest ``MAX_CATCH_UP`` of them (older ones are dropped).

Every run's idempotency key is ``schedule:<name>:<tick>`` (``tick_key``; the tick in UTC), so
a tick is run once even by firers that disagree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from .codec import MAX_PAYLOAD, check_declared_name, check_name, check_run_options, dumps
from .errors import InvalidPayload
from .records import record
from .types import DEFAULT_QUEUE, JSON

if TYPE_CHECKING:  # (imported where a schedule is read: a worker without schedules loads neither)
    from zoneinfo import ZoneInfo

    from cronsim import CronSim

CatchUp = Literal["skip", "one", "all"]
CATCH_UP: tuple[CatchUp, ...] = ("skip", "one", "all")
MAX_CATCH_UP = 1000  # ticks one firing of catch_up="all" runs at most (the newest ones)
ON_TIME = 60.0  # seconds a tick may be late and still run under catch_up="skip"
MAX_SCHEDULES = 1000  # schedules one app declares
_MAX_CRON = 200


def check_schedule_name(name: object) -> str:
    return check_declared_name(name, "a schedule")


def zone(tz: object) -> ZoneInfo:
    """The time zone named ``tz`` (ValueError when there is none of that name)."""
    if not isinstance(tz, str) or not tz or len(tz) > 64:
        raise ValueError(f"tz must name a time zone like 'Europe/Berlin' (got {tz!r})")
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # noqa: PLC0415 - with a schedule only

    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"no time zone {tz!r} (names like 'UTC' or 'Europe/Berlin')") from None


def check_cron(cron: object) -> str:
    """A cron expression cronsim reads (five fields, or six with seconds first)."""
    if not isinstance(cron, str) or not cron.strip() or len(cron) > _MAX_CRON:
        raise ValueError(f"a schedule's cron must be an expression like '*/5 * * * *' "
                         f"(got {cron!r})")  # fmt: skip
    from cronsim import CronSim, CronSimError  # noqa: PLC0415 - with a schedule only

    text = " ".join(cron.split())
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except (CronSimError, ValueError) as exc:
        raise ValueError(f"cron {cron!r}: {exc or 'not a cron expression'}") from None
    return text


def _ticks(cron: str, tz: str, at: float, reverse: bool = False) -> CronSim:
    from cronsim import CronSim  # noqa: PLC0415 - with a schedule only

    start = datetime.fromtimestamp(at, UTC).astimezone(zone(tz))
    return CronSim(cron, start, reverse=reverse)


def next_tick(cron: str, tz: str, after: float) -> float:
    """The first tick strictly after ``after`` (seconds since the epoch)."""
    for dt in _ticks(cron, tz, after):
        if dt.timestamp() > after:
            return dt.timestamp()
    raise ValueError(f"cron {cron!r} never ticks")  # pragma: no cover - cronsim raises first


def ticks_between(cron: str, tz: str, first: float, last: float, most: int) -> list[float]:
    """The newest ``most`` ticks from ``first`` to ``last`` (both included), oldest first."""
    found: list[float] = []
    for dt in _ticks(cron, tz, last + 1e-6, reverse=True):
        t = dt.timestamp()
        if t > last:
            continue
        if t < first or len(found) >= most:
            break
        found.append(t)
    return found[::-1]


def due(cron: str, tz: str, catch_up: str, next_at: float, now: float) -> tuple[list[float], float]:
    """What a firer does at ``now`` with a schedule whose next tick is ``next_at``: the ticks
    to run (oldest first; none when ``next_at`` is still ahead) and the next tick after now."""
    if next_at > now:
        return [], next_at
    most = MAX_CATCH_UP if catch_up == "all" else 1
    ticks = ticks_between(cron, tz, next_at, now, most) or [next_at]
    if catch_up == "skip" and now - ticks[-1] > ON_TIME:
        ticks = []
    return ticks, next_tick(cron, tz, now)


def tick_key(name: str, tick: float) -> str:
    """A tick's run's idempotency key: ``schedule:<name>:<tick in UTC, ISO 8601>``."""
    stamp = datetime.fromtimestamp(round(tick, 3), UTC)
    text = stamp.strftime("%Y-%m-%dT%H:%M:%S")
    if stamp.microsecond:
        text += f".{stamp.microsecond // 1000:03d}"
    return f"schedule:{name}:{text}Z"


@record
class ScheduleSpec:
    """One schedule as an app declares it, checked; ``payload`` is its JSON text."""

    name: str
    cron: str
    tz: str
    task: str
    payload: str
    catch_up: CatchUp
    queue: str | None = None  # None: the task's declared queue (else the default one)
    priority: int | None = None

    @classmethod
    def declare(
        cls, cron: str, *, task: str, name: str | None = None, payload: JSON = None,
        tz: str = "UTC", catch_up: str = "one", queue: str | None = None,
        priority: int | None = None,
    ) -> ScheduleSpec:  # fmt: skip
        """``app.schedule(...)``'s values, checked (ValueError names the bad one)."""
        try:
            check_name(task)
        except InvalidPayload as exc:
            raise ValueError(f"schedule: {exc}") from None
        label = check_schedule_name(task if name is None else name)
        text = check_cron(cron)
        zone(tz)
        if catch_up not in CATCH_UP:
            raise ValueError(f"schedule {label!r}: catch_up must be one of {', '.join(CATCH_UP)}"
                             f" (got {catch_up!r})")  # fmt: skip
        try:
            encoded = dumps(payload, "payload", MAX_PAYLOAD)
            check_run_options(queue or DEFAULT_QUEUE, 0 if priority is None else priority, None)
        except InvalidPayload as exc:
            raise ValueError(f"schedule {label!r}: {exc}") from None
        return cls(label, text, tz, task, encoded, catch_up, queue, priority)

    @property
    def declared(self) -> dict[str, Any]:
        """What the database keeps of it, compared to tell a changed declaration."""
        return {"cron": self.cron, "tz": self.tz, "task": self.task, "payload": self.payload,
                "catch_up": self.catch_up, "queue": self.queue,
                "priority": self.priority}  # fmt: skip


@record
class ScheduleInfo:
    """One schedule as operators see it: its declaration, its next tick, what it fired last."""

    name: str
    cron: str
    tz: str
    task: str
    payload: str  # JSON text
    queue: str
    priority: int
    catch_up: str
    next_at: float
    last_tick: float | None
    last_run: int | None
    fired: int  # runs it started
    declared_by: str
    declared_at: float
    last_status: str | None = None  # the last run's status (None: pruned, or none yet)


@record
class Fired:
    """What one firing did: the ticks it ran (oldest first) and their runs, in order."""

    name: str
    ticks: list[float]
    run_ids: list[int]
    next_at: float
