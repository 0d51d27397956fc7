"""The dashboard's side of paid calls, on every backend: a run page lists every call
as it was made (attempt, owner, paid again, answered / unknown / settled), and a run parked on a
call whose outcome is unknown gets a Resolve form (its answer, or pay again) behind the same
session CSRF token as the other actions; a read-only dashboard draws none and serves none."""

from __future__ import annotations

from urllib.parse import quote

from helpers import FakeClock
from web_helpers import client, csrf_of, text_of

from workerproc.once import call_key
from workerproc.store import CasResult, Commit, Lease, Store
from workerproc.store.calls import parked_on
from workerproc.store.codec import WAIT_FOREVER

TTL = 30.0
REQ = {"model": "m", "prompt": "hello"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def claim(s: Store, owner: str) -> Lease:
    lease = s.claim(owner, TTL)
    assert lease is not None
    return lease


def parked(s: Store, clock: FakeClock) -> int:
    """A run whose first attempt died in its call "llm" and whose second parked on it."""
    run = s.start_run("call")
    first = claim(s, "w1")
    assert s.begin_call(first, call_key(first, "llm", REQ)).outcome == "call"
    clock.advance(TTL + 1)
    second = claim(s, "w2")
    assert s.begin_call(second, call_key(second, "llm", REQ), unknown="park").outcome == "park"
    park = Commit(second, "park", delay=WAIT_FOREVER, wait_for=parked_on("llm"),
                  error="OutcomeUnknown: llm")  # fmt: skip
    assert s.commit_many([park]).results == (CasResult.OK,)
    return run


def timeline_rows(html: str) -> list[str]:
    table = html.split('id="call-timeline"', 1)[1].split("</table>", 1)[0]
    return [text_of(row) for row in table.split("<tr")[2:]]  # after the header's row


def paid_calls(html: str) -> str:
    return text_of(html.split('id="paid-calls"', 1)[1].split("</table>", 1)[0])


def test_a_parked_run_shows_its_calls_and_an_answer_resolves_it(s: Store, clock: FakeClock) -> None:
    run = parked(s, clock)
    c = client(s)
    html = c.get(f"/runs/{run}").text
    assert 'id="waiting-for">outcome_unknown:llm<' in html
    (made,) = timeline_rows(html)
    assert "llm" in made and "unknown" in made and "paid again" not in made
    assert 'action="/runs/' + str(run) + '/resolve"' in html and 'id="resolve-1"' in html
    assert "no answer kept" in paid_calls(html)
    token = csrf_of(html)
    answer = quote('{"text": "from the log"}')
    refused = c.post(f"/runs/{run}/resolve", content=f"csrf=00&name=llm&answer={answer}",
                     headers=FORM)  # fmt: skip
    assert refused.status_code == 403
    cross = c.post(f"/runs/{run}/resolve", content=f"csrf={token}&name=llm&answer={answer}",
                   headers={**FORM, "Origin": "http://evil.example"})  # fmt: skip
    assert cross.status_code == 403
    bad = c.post(f"/runs/{run}/resolve", content=f"csrf={token}&name=llm&answer=%7Bnope",
                 headers=FORM)  # fmt: skip
    assert bad.status_code == 409 and "the answer is not valid JSON" in bad.text
    other = c.post(f"/runs/{run}/resolve", content=f"csrf={token}&name=nope&how=pay_again",
                   headers=FORM)  # fmt: skip
    assert other.status_code == 409 and "made no call named" in other.text
    got = s.get_run(run)
    assert got is not None and got.status == "waiting"  # nothing was done yet
    body = f"csrf={token}&name=llm&how=answer&answer={answer}"
    done = c.post(f"/runs/{run}/resolve", content=body, headers=FORM)
    assert done.status_code == 303 and done.headers["location"] == f"/runs/{run}?done=resolved"
    after = c.get(done.headers["location"]).text
    assert "resolved: its call is settled" in after and "/resolve" not in after
    assert "settled: answer" in timeline_rows(after)[0]
    third = claim(s, "w3")
    start = s.begin_call(third, call_key(third, "llm", REQ), unknown="park")
    assert start.kept is not None and start.kept.result == {"text": "from the log"}


def test_pay_again_from_the_form_and_the_timeline_shows_the_second_call(
    s: Store, clock: FakeClock
) -> None:
    run = parked(s, clock)
    c = client(s)
    token = csrf_of(c.get(f"/runs/{run}").text)
    body = f"csrf={token}&name=llm&how=pay_again&answer="
    assert c.post(f"/runs/{run}/resolve", content=body, headers=FORM).status_code == 303
    third = claim(s, "w3")
    key = call_key(third, "llm", REQ)
    start = s.begin_call(third, key, unknown="park")
    assert start.outcome == "call" and start.again
    in_flight = timeline_rows(c.get(f"/runs/{run}").text)
    assert "settled: pay again" in in_flight[0]
    assert "paid again" in in_flight[1] and "in flight" in in_flight[1]
    s.keep_call(third, key, {"text": "paid again"}, 5, intent=start.intent)
    html = c.get(f"/runs/{run}").text
    first, second = timeline_rows(html)
    assert "w1" in first and "settled: pay again" in first
    assert "w3" in second and "paid again" in second and "answered at +" in second
    assert "/resolve" not in html  # answered: nothing left to resolve
    assert "paid 2x, 1 unknown" in paid_calls(html)


def test_a_run_that_is_over_gets_no_form_and_a_read_only_dashboard_none(
    s: Store, clock: FakeClock
) -> None:
    run = parked(s, clock)
    ro = client(s, read_only=True)
    html = ro.get(f"/runs/{run}").text
    assert 'id="call-timeline"' in html and '<form method="post"' not in html
    refused = ro.post(f"/runs/{run}/resolve", content="csrf=x&name=llm&how=pay_again",
                      headers=FORM)  # fmt: skip
    assert refused.status_code in (404, 405)
    c = client(s)
    token = csrf_of(c.get(f"/runs/{run}").text)
    assert s.cancel_run(run)
    assert "/resolve" not in c.get(f"/runs/{run}").text
    over = c.post(f"/runs/{run}/resolve", content=f"csrf={token}&name=llm&how=pay_again",
                  headers=FORM)  # fmt: skip
    assert over.status_code == 409 and "was cancelled" in over.text


def test_a_run_page_says_which_batch_call_each_attempt_went_in(s: Store) -> None:
    from workerproc.store import ClaimRequest  # noqa: PLC0415 - this test only

    runs = [s.start_run("embed") for _ in range(3)]
    leases = s.commit_many([], claim=ClaimRequest("w1", TTL, limit=3, task="embed")).leases
    assert s.batch_started(leases, "7.1") == 3
    html = client(s).get(f"/runs/{runs[1]}").text
    table = text_of(html.split('id="batches"', 1)[1].split("</table>", 1)[0])
    assert "embed" in table and "7.1" in table and " 3 " in f" {table} "
