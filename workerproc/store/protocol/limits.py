"""Limits kept in the database, written once: what apps declare and operators set,
and what a task's limits make of a run when it is enqueued (its gates, its line, its token
reservation: ``Gatekeeper``), so that the claim needs no Python to know where a run waits.

Declarations: every worker writes its app's limits when it starts (only what differs). A
limit's numbers are the declared ones until an operator sets others (``set_limit``, ``supervisor
limits set``); those win until a declaration with other numbers arrives (a new release of the
app), which replaces both. A host that declares numbers other than the ones another host
declared is told so (the answer of ``declare_limits``), and its numbers win: the newest
deployment decides, as with task options.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..codec import task_options
from ..dialect import Dialect, Row, Tx
from ..driver import Placing
from ..errors import InvalidOption, StoreError
from ..limits import (
    NUMBERS,
    SEP,
    GateState,
    Gating,
    LimitInfo,
    LimitKey,
    LimitSpec,
    check_limit_name,
    gating,
    refill,
    split_gate,
    unfit,
)
from ..newrun import NewRun
from ..starts import joined

REFRESH = 1.0  # seconds a store trusts what it read of the declarations


def _spec(row: Row) -> LimitSpec:
    name, per, rate, burst, concurrency, tokens, token_burst = row[:7]
    return LimitSpec(name, rate, burst, concurrency, tokens, token_burst, per)


def reservations(options: Iterable[Row]) -> dict[str, tuple[tuple[str, ...], int | None]]:
    """The limits and token reservation of every task with limits (``TASK_OPTIONS`` rows)."""
    out = {}
    for name, text in options:
        o = task_options(text)
        if o.limits:
            out[name] = (o.limits, o.tokens)
    return out


class Gatekeeper:
    """What every task's limits are, read from the database at most every ``REFRESH`` s."""

    def __init__(self) -> None:
        self.read_at = -1e18
        self.tasks: dict[str, tuple[tuple[str, ...], int | None]] = {}
        self.specs: dict[str, LimitSpec] = {}

    def stale(self) -> bool:
        return time.monotonic() - self.read_at > REFRESH

    def learn(self, options: Iterable[Row], specs: Iterable[Row]) -> None:
        self.tasks = reservations(options)
        self.specs = {row[0]: _spec(row) for row in specs}
        self.read_at = time.monotonic()

    def gated(self, task: str) -> bool:
        return task in self.tasks and any(n in self.specs for n in self.tasks[task][0])

    def of(self, task: str, payload: Any) -> Gating:
        limits, tokens = self.tasks[task]
        return gating(limits, self.specs, tokens, payload)

    def runs(self, runs: list[NewRun]) -> list[NewRun]:
        """``runs`` with their gating (a task without limits: unchanged)."""
        if not self.tasks:
            return runs
        return [r.gated(self.of(r.task, json.loads(r.payload))) if self.gated(r.task) else r
                for r in runs]  # fmt: skip


class Limits:
    dialect: Dialect
    _gatekeeper: Gatekeeper | None = None

    def gatekeeper(self) -> Gatekeeper:
        """The declarations, fresh within ``REFRESH`` seconds."""
        keeper = self._gatekeeper
        if keeper is None:
            keeper = self._gatekeeper = Gatekeeper()
        if keeper.stale():
            options, specs = self.dialect.read(
                lambda tx: (tx.rows("TASK_OPTIONS", {}), tx.rows("LIMIT_SPECS", {}))
            )
            keeper.learn(options, specs)
        return keeper

    def declare_limits(self, specs: Mapping[str, LimitSpec], by: str) -> list[str]:
        """Write the numbers an app declares (``by``: who declares, for the record); returns
        a line for each limit another host had declared otherwise (this declaration wins), and
        one (``too_large``'s, starting ``task``) for each task in the database whose token
        reservation one of these limits can never admit: its runs fail at claim (B12)."""
        told: list[str] = []

        def write(tx: Tx) -> list[str]:
            held = {row[0]: row for row in tx.rows("LIMIT_ROWS", {})}
            for name, spec in sorted(specs.items()):
                check_limit_name(name)
                declared = json.dumps(spec.numbers, sort_keys=True)
                row = held.get(name)
                if row is not None and json.loads(row[7]) == spec.numbers and row[1] == spec.per:
                    continue  # the same declaration: an operator's numbers, if any, stay
                if row is not None and row[8] != by:
                    before = json.loads(row[7])
                    told.append(
                        f"limit {name!r}: {by} declares {spec.numbers}, {row[8]} had "
                        f"declared {before}; the new numbers apply"
                    )
                tx.count(
                    "DECLARE_LIMIT",
                    {
                        "name": name,
                        "per": spec.per,
                        **_numbers(spec),
                        "declared": declared,
                        "by": by,
                        "now": tx.now,
                    },
                )
            # B12: a reservation one of these limits can never admit (a task of another
            # app, or numbers an operator set): its runs fail at claim, said here first
            now = {row[0]: _spec(row) for row in tx.rows("LIMIT_SPECS", {}) if row[0] in specs}
            return told + unfit(reservations(tx.rows("TASK_OPTIONS", {})), now)

        result = self.dialect.write(write)
        self._gatekeeper = None
        return result

    def set_limit(self, name: str, **numbers: Any) -> LimitSpec:
        """An operator's numbers for limit ``name`` (only those given change; 0 lifts one),
        for every worker on every host until a declaration with other numbers arrives."""
        unknown = set(numbers) - set(NUMBERS)
        if unknown:
            raise InvalidOption(f"limits have no {', '.join(sorted(unknown))}")

        def write(tx: Tx) -> LimitSpec:
            rows = {row[0]: row for row in tx.rows("LIMIT_ROWS", {})}
            if name not in rows:
                raise StoreError(f"no limit {name!r} (an app declares it with app.limit)")
            current = _spec(rows[name])
            merged = {**current.numbers, **numbers}
            merged = {k: v for k, v in merged.items() if v}  # 0 lifts that dimension
            for bucket, size in (("rate", "burst"), ("tokens", "token_burst")):
                if bucket not in merged and not numbers.get(size):  # with its bucket's size
                    merged.pop(size, None)
            if not {"rate", "concurrency", "tokens"} & set(merged):
                lifted = ", ".join(k for k, v in numbers.items() if not v)
                raise InvalidOption(
                    f"limit {name!r} would limit nothing: lifting {lifted} leaves it no rate, "
                    "concurrency or tokens (keep one; to let every run through, give it a "
                    "high one, such as concurrency 1000000)"
                )
            try:
                spec = LimitSpec.declare(name, per=current.per, **merged)
            except ValueError as exc:  # a number out of range: a bad value
                raise InvalidOption(str(exc)) from None
            overrides = json.loads(rows[name][9]) if rows[name][9] else {}
            overrides.update(numbers)
            tx.count(
                "SET_LIMIT",
                {
                    "name": name,
                    **_numbers(spec),
                    "now": tx.now,
                    "overrides": json.dumps(overrides, sort_keys=True),
                },
            )
            return spec

        return self.dialect.write(write)

    def repair_lines(self) -> list[str]:
        """``check``'s recount of the lines: every line with runs waiting in it whose
        gate could keep them waiting for ever (no gate row; closed with nothing to reopen it; or
        closed until later although its first due run has room in every gate now) is opened
        now, for the next claim to decide. A line for people each, of what was repaired."""
        return self.dialect.write(repair_lines)

    def limits(self, keys: int = 5) -> list[LimitInfo]:
        """Every limit: its numbers, its use now (live leases, waiting runs) and its ``keys``
        busiest keys."""

        def read(tx: Tx) -> list[LimitInfo]:
            out = []
            now = tx.time()
            for row in tx.rows("LIMIT_ROWS", {}):
                spec = _spec(row)
                ask = keys if spec.per is not None else max(1, keys)  # its one gate's levels
                busy = [_key(spec, r, now)
                        for r in tx.rows("LIMIT_KEYS", {"lim": row[0], "now": tx.now,
                                                        "limit": ask})]  # fmt: skip
                total = tx.one("LIMIT_USE", {"lim": row[0], "now": tx.now}) or (0, 0, 0)
                unused = LimitKey("", 0, 0, None, *_levels(spec, None, now))  # no gate yet
                lone = busy[0] if busy else unused
                busy = busy[:keys]
                out.append(LimitInfo(
                    row[0], spec, json.loads(row[7]), row[8],
                    json.loads(row[9]) if row[9] else None, int(total[0] or 0),
                    int(total[1] or 0), int(total[2] or 0), busy,
                    lone.level if spec.per is None else None,
                    lone.tokens_left if spec.per is None else None,
                ))  # fmt: skip
            return out

        return self.dialect.read(read, snapshot=True)


def repair_lines(tx: Tx) -> list[str]:
    """``Limits.repair_lines`` in ``tx``."""
    now, repaired = tx.time(), []
    for line, ready_at, _idle, _blocked, missing, waiting in tx.rows(
        "LINES_WAITING", {"now": tx.now}
    ):
        if missing:
            why = "its gate had no row"
            tx.run_program(joined(Placing((line,), (line,)), tx.now))
        elif ready_at is None:
            why = "its line was closed with nothing to reopen it"
        elif ready_at > now and _admits_now(tx, line, now):
            why = f"its line was closed for {ready_at - now:.3g} s more although a run had room"
        else:
            continue
        tx.count("REOPEN_GATES", {"gate": line, "now": tx.now})
        lim, key = split_gate(line)
        where = f"limit {lim!r}" + (f" key {key!r}" if SEP in line else "")
        repaired.append(f"{where}: {waiting} run(s) waiting, {why}: reopened")
    return repaired


def _admits_now(tx: Tx, line: str, now: float) -> bool:
    """Whether the first due run of ``line`` has room in every gate of its task now (a gate
    another claimer holds, on PostgreSQL: not judged, False)."""
    first = tx.look_gates((), [line], None, 1).runs[line]
    if not first:
        return False
    gates = first[0].gates
    states = {row[0]: GateState.of(row) for row in tx.look_gates(gates).states}
    return len(states) == len(gates) and all(s.admits(now, first[0].need) for s in states.values())


def _levels(spec: LimitSpec, row: Row | None, now: float) -> tuple[float | None, float | None]:
    """A gate's buckets now (``row``: its level, level_at, tok_level, tok_at; None: unused)."""
    level, level_at, tok_level, tok_at = row if row is not None else (None,) * 4
    rate = None
    if spec.rate is not None and spec.burst is not None:
        rate = refill(level, level_at, spec.rate, spec.burst, now)
    toks = None
    if spec.tokens is not None and spec.token_burst is not None:
        toks = refill(tok_level, tok_at, spec.tokens, spec.token_burst, now)
    return rate, toks


def _key(spec: LimitSpec, row: Row, now: float) -> LimitKey:
    key, live, waiting, paused = row[:4]
    return LimitKey(key, int(live or 0), int(waiting or 0), paused,
                    *_levels(spec, row[4:8], now))  # fmt: skip


def _numbers(spec: LimitSpec) -> dict[str, Any]:
    return {k: getattr(spec, k) for k in NUMBERS}
