"""Webhook signatures (B19): what ``workerproc.webhooks.verify`` accepts and refuses."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from workerproc.webhooks import SignatureError, sign, signature_header, verify

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
