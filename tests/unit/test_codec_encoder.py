"""The store's JSON encoder is made once: ``codec.dumps`` (a state and a result at every finish)
builds no JSONEncoder per call, and writes what ``json.dumps`` with the same options writes."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from workerproc.store import InvalidPayload, codec

VALUES: list[Any] = [None, 0, -1.5, "é\u2028", True, [], {}, {"a": [1, {"b": None}]},
                     list(range(50)), {"k" * 10: "v" * 100}]  # fmt: skip


def test_dumps_makes_no_encoder_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []
    init = json.JSONEncoder.__init__

    def counting(self: json.JSONEncoder, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(json.JSONEncoder, "__init__", counting)
    for value in VALUES:
        codec.dumps(value, "state")
    assert made == []


@pytest.mark.parametrize("value", VALUES)
def test_dumps_writes_what_json_dumps_writes(value: Any) -> None:
    assert codec.dumps(value, "state") == json.dumps(value, separators=(",", ":"),
                                                     allow_nan=False)  # fmt: skip


@pytest.mark.parametrize("bad", [math.nan, {"x": math.inf}, {1, 2}, object()])
def test_dumps_still_refuses_what_json_cannot_carry(bad: Any) -> None:
    with pytest.raises(InvalidPayload):
        codec.dumps(bad, "result")


def test_a_claims_served_entries_are_checked_once_each_and_a_bad_one_at_every_claim() -> None:
    assert codec.checked_served(("b", "a@2", "b")) == ("b", "a@2")  # in order, each once
    served = ("b", "a@2", "b")
    assert codec.checked_served(served) is codec.checked_served(served)  # made once
    for _ in range(2):  # a refusal is never remembered as an answer
        with pytest.raises(InvalidPayload, match="task name"):
            codec.checked_served(("ok", "bad\x00name"))
    assert codec.names_json(("a", "b")) == codec.names_json(["a", "b"]) == '["a", "b"]'
