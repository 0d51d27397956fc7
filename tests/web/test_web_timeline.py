"""The run timeline, composed from a task row, the attempt history and refused writes: the
cases the store tests do not reach through a page (an expired lease nobody took over yet, an
exhausted claim, attempts from before the history was kept)."""

from __future__ import annotations

from dataclasses import replace

from supervisor.web import charts
from supervisor.web.timeline import build
from workerproc.store import AttemptEnd, Rejection, TaskInfo

TASK = TaskInfo(id=7, run_id=1, name="call", payload=None, available_at=0.0, created_at=0.0,
                lease_owner=None, lease_expires_at=None, attempts=0, attempt_base=0,
                last_error=None, done_at=None)  # fmt: skip


def test_an_expired_lease_not_yet_taken_over_is_shown_as_such() -> None:
    task = replace(TASK, attempts=1, lease_owner="w1", lease_expires_at=10.0, claimed_at=4.0)
    (line,) = build([task], [], [], now=12.0)
    (a,) = line.attempts
    assert (a.outcome, a.owner, a.ended_at, a.held(12.0)) == ("expired", "w1", 10.0, 6.0)
    (live,) = build([task], [], [], now=9.0)[0].attempts
    assert (live.outcome, live.expires_at, live.held(9.0)) == ("holding", 10.0, 5.0)


def test_an_exhausted_run_and_attempts_from_before_the_history() -> None:
    task = replace(TASK, attempts=4, claimed_at=30.0)
    history = [
        AttemptEnd(7, 3, "w3", 20.0, 22.0, "taken_over", taken_by="w4"),
        AttemptEnd(7, 4, "w4", 30.0, 30.0, "exhausted"),
    ]
    refused = [Rejection(1, 25.0, 7, 1, "w3", 3, "renew"), Rejection(2, 26.0, 9, 1, "x", 1, "ack")]
    (line,) = build([task], history, refused, now=40.0)
    got = [(a.number, a.outcome, a.owner) for a in line.attempts]
    assert got == [(1, "unknown", None), (2, "unknown", None), (3, "taken_over", "w3"),
                   (4, "exhausted", "w4")]  # fmt: skip
    taken = line.attempts[2]
    assert taken.taken_after == 8.0  # the next claim came 8 s after the lease ended
    assert [r.op for r in taken.refused] == ["renew"]  # only this task's, this attempt's
    assert line.attempts[3].label == "refused: attempts exhausted"


def test_the_committed_attempt_and_the_chart_of_it() -> None:
    task = replace(TASK, attempts=2, claimed_at=5.0, done_at=6.5, done_attempt=2,
                   done_owner="w2")  # fmt: skip
    history = [AttemptEnd(7, 1, "w1", 1.0, 2.0, "released", error="ValueError: x")]
    lines = build([task], history, [Rejection(1, 3.0, 7, 1, "w1", 1, "ack")], now=9.0)
    released, committed = lines[0].attempts
    assert (released.error, committed.outcome, committed.owner) == (
        "ValueError: x", "committed", "w2",
    )  # fmt: skip
    assert committed.held(9.0) == 1.5
    chart = charts.run_timeline(lines, start=0.0, end=10.0)
    bars = [m for m in chart.marks if m.w > 0]
    ticks = [m for m in chart.marks if m.w == 0]
    assert [m.css for m in bars] == ["released", "committed"]
    assert bars[0].x < ticks[0].x < bars[1].x  # the refused ack, between the two attempts
    assert [label for _, _, label in chart.labels][:2] == ["call (7) #1", "call (7) #2"]
