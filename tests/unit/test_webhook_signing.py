"""Webhook signatures (B20): what ``workerproc.webhooks.verify`` accepts and refuses; malformed
input of any kind is a ``SignatureError`` and nothing else, ``tolerance`` counts whole seconds
(0: the current second), and a replay is the same signed id."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workerproc.webhooks import HEADER, SignatureError, sign, signature_header, verify

SECRET = "s3cret-key"
BODY = '{"id":7,"kind":"run.succeeded"}'
NOW = 1_700_000_000


def test_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    want = hmac.new(SECRET.encode(), f"{NOW}.{BODY}".encode(), hashlib.sha256).hexdigest()
    assert sign(SECRET, NOW, BODY) == want
    assert signature_header(SECRET, BODY, NOW) == f"t={NOW},v1={want}"


def test_verify_accepts_a_fresh_signature_and_returns_its_time() -> None:
    header = signature_header(SECRET, BODY, NOW)
    assert verify(SECRET, header, BODY, now=NOW + 299) == NOW
    assert verify(SECRET.encode(), header, BODY.encode(), now=NOW - 10) == NOW


def test_verify_accepts_any_matching_v1_among_several() -> None:
    good = signature_header(SECRET, BODY, NOW)
    header = f"t={NOW},v1={'0' * 64},{good.split(',')[1]}"
    assert verify(SECRET, header, BODY, now=NOW) == NOW


@pytest.mark.parametrize(
    ("header", "body", "secret", "message"),
    [
        (None, BODY, SECRET, "no Leasekeeper-Signature"),
        ("", BODY, SECRET, "no Leasekeeper-Signature"),
        ("garbage", BODY, SECRET, "not key=value"),
        (f"v1={'a' * 64}", BODY, SECRET, "no timestamp"),
        (f"t={NOW}", BODY, SECRET, "no v1"),
        (f"t=-5,v1={'a' * 64}", BODY, SECRET, "not a time"),
        (f"t={NOW},v1={'a' * 64}", BODY, SECRET, "does not match"),
        (signature_header(SECRET, BODY, NOW), BODY + " ", SECRET, "does not match"),
        (signature_header(SECRET, BODY, NOW), BODY, "other", "does not match"),
        ("t=1," * 2000, BODY, SECRET, "longer than"),
    ],
)
def test_verify_refuses(header: str | None, body: str, secret: str, message: str) -> None:
    with pytest.raises(SignatureError, match=message):
        verify(secret, header, body, now=NOW)


def test_verify_refuses_a_stale_or_future_signature() -> None:
    header = signature_header(SECRET, BODY, NOW)
    with pytest.raises(SignatureError, match="away from now"):
        verify(SECRET, header, BODY, now=NOW + 301)
    with pytest.raises(SignatureError, match="away from now"):
        verify(SECRET, header, BODY, now=NOW - 301)
    assert verify(SECRET, header, BODY, tolerance=600, now=NOW + 500) == NOW


@pytest.mark.parametrize("tolerance", [-1, 86_401, True])
def test_tolerance_has_a_range(tolerance: float) -> None:
    with pytest.raises(ValueError, match="tolerance"):
        verify(SECRET, signature_header(SECRET, BODY, NOW), BODY, tolerance=tolerance, now=NOW)


def test_an_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        sign("", NOW, BODY)


# -- malformed input is a SignatureError, whatever it is ----------------------------------------
GOOD = sign(SECRET, NOW, BODY)


@pytest.mark.parametrize(
    ("header", "body", "message"),
    [
        (f"t={NOW},v1=é{GOOD[1:]}", BODY, "not ASCII"),  # was a TypeError from compare_digest
        (f"t={NOW},v1=\u0660", BODY, "not ASCII"),  # an Arabic-Indic digit
        (f"t=\u0661\u0662,v1={GOOD}", BODY, "not ASCII"),
        (f"t={NOW},v1={GOOD[:-1]}", BODY, "not 64 hex digits"),
        (f"t={NOW},v1={GOOD}0", BODY, "not 64 hex digits"),
        (f"t={NOW},v1={'g' * 64}", BODY, "not 64 hex digits"),
        (f"t={NOW},v1=", BODY, "not 64 hex digits"),
        (f"t={NOW},t={NOW},v1={GOOD}", BODY, "more than one t="),
        (f"t=,v1={GOOD}", BODY, "not a time"),
        (f"t={NOW},,v1={GOOD}", BODY, "not key=value"),
        (f"={NOW}", BODY, "no timestamp"),
        ("t=" + "9" * 13 + f",v1={GOOD}", BODY, "not a time"),
        (b"t=1,v1=\xff", BODY, "not ASCII"),
        (12345, BODY, "not text"),
        (["t=1"], BODY, "not text"),
        (signature_header(SECRET, BODY, NOW), "\ud800", "cannot be checked"),
        (signature_header(SECRET, BODY, NOW), 5, "cannot be checked"),
        (signature_header(SECRET, BODY, NOW), None, "cannot be checked"),
    ],
)
def test_verify_raises_only_signature_error_on_malformed_input(
    header: object, body: object, message: str
) -> None:
    with pytest.raises(SignatureError, match=message):
        verify(SECRET, header, body, now=NOW)  # type: ignore[arg-type]


@settings(max_examples=400, deadline=None)
@given(
    header=st.one_of(st.none(), st.text(max_size=200), st.binary(max_size=200),
                     st.lists(st.sampled_from(["t=", "v1=", ",", "=", str(NOW), GOOD, "é",
                                               "\x00", " ", GOOD.upper(), "9" * 20]),
                              max_size=12).map("".join)),
    body=st.one_of(st.text(max_size=50), st.binary(max_size=50)),
)  # fmt: skip
def test_verify_raises_nothing_but_signature_error_for_any_header(
    header: str | bytes | None, body: str | bytes
) -> None:
    with contextlib.suppress(SignatureError):
        verify(SECRET, header, body, now=NOW)


def test_bytes_headers_and_upper_case_hex_are_accepted() -> None:
    header = signature_header(SECRET, BODY, NOW)
    assert verify(SECRET, header.encode(), BODY, now=NOW) == NOW
    assert verify(SECRET, f"t={NOW},v1={GOOD.upper()}", BODY, now=NOW) == NOW


def test_tolerance_counts_whole_seconds_and_zero_accepts_the_current_second() -> None:
    header = signature_header(SECRET, BODY, NOW)
    assert verify(SECRET, header, BODY, tolerance=0, now=NOW) == NOW  # refused before
    assert verify(SECRET, header, BODY, tolerance=0, now=NOW + 0.999) == NOW
    for now in (NOW + 1, NOW - 0.5):
        with pytest.raises(SignatureError, match=r"1 s away from now \(tolerance 0 s\)"):
            verify(SECRET, header, BODY, tolerance=0, now=now)
    assert verify(SECRET, header, BODY, tolerance=300, now=NOW + 300.9) == NOW
    with pytest.raises(SignatureError, match="301 s away"):
        verify(SECRET, header, BODY, tolerance=300, now=NOW + 301)
    assert verify(SECRET, signature_header(SECRET, BODY), BODY, tolerance=0) > 0  # the wall clock


@pytest.mark.parametrize("tolerance", [float("nan"), "300", None])
def test_a_tolerance_that_is_no_number_is_the_callers_error(tolerance: object) -> None:
    with pytest.raises(ValueError, match="tolerance"):
        verify(SECRET, signature_header(SECRET, BODY, NOW), BODY, tolerance=tolerance, now=NOW)  # type: ignore[arg-type]


def test_a_replay_with_a_new_header_value_is_the_same_signed_id() -> None:
    """The documented receiver: verify, then deduplicate on the signed body's id. A captured
    delivery replayed within the tolerance with any header changed is still that id (and a
    body with another id no longer verifies)."""
    seen: list[int] = []

    def receive(headers: dict[str, str], body: bytes) -> int:
        try:
            verify(SECRET, headers.get(HEADER), body, now=NOW + 5)
        except SignatureError:
            return 400
        event = json.loads(body)
        if event["id"] not in seen:
            seen.append(event["id"])
        return 204

    body = b'{"id":7,"kind":"run.succeeded"}'
    captured = {HEADER: signature_header(SECRET, body, NOW)}
    assert receive(captured, body) == 204
    assert receive({**captured, "Leasekeeper-Event": "8"}, body) == 204  # replayed, relabelled
    assert receive(captured, body.replace(b'"id":7', b'"id":8')) == 400  # another id: not ours
    assert seen == [7]
