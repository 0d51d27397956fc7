"""JSON in and out of the store: the only encoding payloads, state and results get (no pickle:
loading a pickle from a shared database is code execution).

Limits keep one bad value from hurting everyone: a payload of at most ``MAX_PAYLOAD`` bytes, a
state or result of at most ``MAX_STATE`` bytes, and at most ``MAX_DEPTH`` levels of nesting
(Python's JSON decoder recurses: a value nested a thousand deep could not be decoded by the
worker that claims it). They are checked where values enter: ``start_run``, ``advance``,
``finish``, a handler's return value, and the CLI's ``--payload``/``--state``.

The limits of the names the store keeps (task names, keys, queues, owners) live here too, the
same on every backend.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import InvalidCommit, InvalidPayload
from .redaction import redact
from .types import JSON, NO_OPTIONS, Commit, TaskOptions

if TYPE_CHECKING:
    from .limits import Gating

RESERVED = "leasekeeper."  # the prefix of leasekeeper's own tasks and queues (no app may use it)

MAX_DEPTH = 100
MAX_PAYLOAD = 1 << 20  # 1 MiB
MAX_STATE = 8 << 20  # 8 MiB
MAX_DELAY = 365 * 86_400.0  # a year: a run that is never due is a mistake, not a schedule
# a wait without a timeout: its next task is due in a century, unless a signal comes first
WAIT_FOREVER = 100 * 365 * 86_400.0


def check_depth(value: JSON, what: str, limit: int = MAX_DEPTH) -> None:
    """Raise InvalidPayload when ``value`` nests arrays/objects deeper than ``limit``."""
    if not isinstance(value, (dict, list)):
        return
    stack: list[tuple[JSON, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise InvalidPayload(f"{what} is nested deeper than {limit} levels")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


# one encoder, made once: ``json.dumps`` with any option builds a new JSONEncoder per call,
# and a no-op run encodes its state and its result at every finish
_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def dumps(value: JSON, what: str, limit: int = MAX_STATE) -> str:
    """JSON-encode ``value`` (at most ``limit`` bytes) or raise InvalidPayload naming ``what``.
    Whatever goes wrong inside (a container whose methods raise, say) is InvalidPayload too: a
    bad value fails its own caller, never the code that tried to encode it."""
    if value is None:  # the hot path's state and result (a no-op's): nothing to check
        return "null"
    try:
        check_depth(value, what)
        text = _encode(value)
    except InvalidPayload:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serializable: {exc}") from None
    except Exception as exc:
        raise InvalidPayload(f"{what} cannot be encoded: {type(exc).__name__}: {exc}") from None
    if len(text) > limit:  # characters; the byte count can only be larger
        raise InvalidPayload(f"{what} is {len(text):,} bytes of JSON, over the limit of {limit:,}")
    return text


# the JSON texts decoded without the parser (their values immutable: shared)
_CONSTANTS: dict[str, JSON] = {"null": None, "true": True, "false": False}
_NOT_CONSTANT = object()


def loads(text: str | None, what: str = "a stored value") -> JSON:
    """Decode JSON from the database; InvalidPayload (never RecursionError) when it cannot be."""
    if text is None:
        return None
    if text == "{}":  # the hot path's payload: a fresh dict, as json.loads gives
        return {}
    constant = _CONSTANTS.get(text, _NOT_CONSTANT)  # (a run's first state, 'null')
    if constant is not _NOT_CONSTANT:
        return constant
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidPayload(f"{what} cannot be decoded: {reason}") from None


def parse(text: str, what: str, limit: int = MAX_STATE) -> JSON:
    """Parse JSON given by a user (``--payload``): strict (no NaN or Infinity), within the
    limits; InvalidPayload naming ``what`` otherwise."""

    def no_constants(name: str) -> JSON:
        raise ValueError(f"{name} is not JSON")

    if len(text) > limit:
        raise InvalidPayload(f"{what} is {len(text):,} bytes, over the limit of {limit:,}")
    try:
        value = json.loads(text, parse_constant=no_constants)
    except RecursionError:
        raise InvalidPayload(f"{what} is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise InvalidPayload(f"{what} is not valid JSON: {exc}") from None
    check_depth(value, what)
    return value


# The names the store keeps, the same limits on every backend (and for every path that writes
# or looks one up: start_run, start_runs, advance, claims, the CLI's filters), so a value one
# backend takes is never one another refuses. Free text (an error, a reason) is cleaned instead
# (``clean_text``).
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
PRIORITY_RANGE = (-1000, 1000)
MAX_KEY = 255
MAX_NAME = 200  # a task's name
MAX_OWNER = 255  # a lease's owner (a worker's is host:pid:start-time:random)
MAX_ERROR = 4000  # an error kept on a task and its run
# What a name must not hold: control characters (C0, DEL, C1), line and paragraph separators,
# and the bidirectional controls (U+202E shows "evil\u202etxt.exe" as "evilexe.txt"): each
# makes a name print as something else than it is, or over several lines.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _unicode(text: str) -> bool:
    """Encodable as UTF-8 (no lone surrogate): what both backends can store."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(value: object, limit: int = 40) -> str:
    """``value`` for an error message: its repr, cut short, and never an exception of its own
    (a user's object whose ``__repr__`` raises)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# W3C Trace Context ``traceparent``: version 00, a trace id and a parent span id (not all
# zeros), the flags; lower-case hex only
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def check_traceparent(value: object) -> str | None:
    """A run's ``traceparent`` as given: a W3C one (55 characters), or "" for none (None)."""
    if value == "":
        return None
    if not isinstance(value, str) or _TRACEPARENT.fullmatch(value) is None:
        raise InvalidPayload(
            "traceparent must be a W3C traceparent, 00-<32 hex>-<16 hex>-<2 hex> "
            f"(got {shown(value, 80)})"
        )
    return value


ID_RANGE = range(-(2**63), 2**63)  # every backend's ids are signed 64-bit integers


def can_exist(row_id: int) -> bool:
    """Whether a row could have this id: a read of one beyond 64 bits answers as for an unknown
    id on every backend (SQLite cannot even bind it)."""
    return row_id in ID_RANGE


MAX_VERSION = 1_000_000  # a task's version (B25): 1 to this


def served_entry(entry: str) -> tuple[str, int | None]:
    """A served-tasks entry's task name and version: ``"name@3"`` (B25), or a plain name
    (None: its unversioned runs, B22)."""
    name, sep, number = entry.rpartition("@")
    if sep and name and number.isdigit() and 1 <= int(number) <= MAX_VERSION:
        return name, int(number)
    return entry, None


def check_served(entry: object) -> str:
    """A claim's served entry (B22, B25): a task name, or ``name@version``."""
    if not isinstance(entry, str):
        return check_name(entry)
    check_name(served_entry(entry)[0])
    return entry


@functools.lru_cache(maxsize=256)
def checked_served(entries: tuple[str, ...]) -> tuple[str, ...]:
    """A claim's served entries (``check_served`` each), each once, in order. A worker asks
    with the same ones at every claim: they are checked once, not at every claim."""
    return tuple(check_served(entry) for entry in dict.fromkeys(entries))


def names_json(names: Sequence[str]) -> str:
    """Names (tasks, queues) as a JSON array, for a statement's parameter; a worker's claims
    pass the same tuple every time, whose text is made once."""
    return _names_json(names) if type(names) is tuple else json.dumps(names)


@functools.lru_cache(maxsize=256)
def _names_json(names: tuple[str, ...]) -> str:
    return json.dumps(names)


def check_task_version(version: object) -> int | None:
    """A run's task version (B25): None (unversioned) or 1 to ``MAX_VERSION``."""
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise InvalidPayload(f"a task's version must be a whole number from 1 to "
                             f"{MAX_VERSION:,} (got {shown(version)})")  # fmt: skip
    return version


def check_name(name: object, what: str = "task name") -> str:
    """A name a user gives (a task's, a signal's, a call's), the same limits on every backend:
    a string of 1 to ``MAX_NAME`` characters, valid Unicode, and nothing that prints as
    something else (``_CONTROL``: control characters, NUL included, line separators and the
    bidirectional controls)."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
        raise InvalidPayload(
            f"{what} must be a string of 1 to {MAX_NAME} characters (got {shown(name)})"
        )
    if _CONTROL.search(name):
        raise InvalidPayload(
            f"{what} must not contain control characters or bidirectional controls "
            f"(got {ascii(name)[:80]})"
        )
    if not _unicode(name):
        raise InvalidPayload(f"{what} is not valid Unicode (a lone surrogate): {name!r}")
    return name


def clean_text(text: str | None, limit: int = MAX_ERROR) -> str | None:
    """Free text we keep (an error, a reason) made storable everywhere: at most ``limit``
    characters, NUL and lone surrogates written as escapes instead of refused, and the
    secrets of any URL it quotes masked (``redact``: its password, and its query's secrets;
    every query value of a web URL. A handler's error may quote the URL of a database it could
    not reach, or an API's with its key, and ``show``, the dashboard and backups show it on)."""
    if text is None:
        return None
    text = redact(str(text)[: limit + 1000])[:limit]  # masked before a cut ends a URL early
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not _unicode(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


DECLARED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def check_declared_name(name: object, what: str) -> str:
    """The name of something an app or an operator declares (a limit, a schedule): 1 to 64
    letters, digits, '_', '.' or '-', starting with a letter or digit (ValueError otherwise)."""
    if not isinstance(name, str) or not DECLARED_NAME.match(name):
        raise ValueError(
            f"{what}'s name must be 1 to 64 letters, digits, '_', '.' or '-' (got {name!r})"
        )
    return name


def check_queue(queue: object) -> str:
    """A queue's name: 1-64 characters of ``[A-Za-z0-9_.:-]`` (so no NUL, nothing to encode)."""
    if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
        raise InvalidPayload(
            f"queue must be 1-64 characters of letters, digits and _.:- (got {shown(queue)})"
        )
    return queue


def check_key(key: object) -> str:
    """An idempotency key: a string of 1 to ``MAX_KEY`` characters, valid Unicode, no NUL."""
    return _text(key, "key", MAX_KEY)


def check_owner(owner: object) -> str:
    """A lease's owner: a string of 1 to ``MAX_OWNER`` characters, valid Unicode, no NUL."""
    return _text(owner, "a lease's owner", MAX_OWNER)


def check_text(value: object, what: str, limit: int = MAX_OWNER) -> str:
    """A short string a backend keeps as it is: 1 to ``limit`` characters, valid Unicode, no
    NUL (PostgreSQL refuses a NUL, SQLite would keep it)."""
    return _text(value, what, limit)


def _text(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= limit:
        raise InvalidPayload(f"{what} must be a string of 1 to {limit} characters")
    if "\x00" in value or not _unicode(value):
        raise InvalidPayload(f"{what} must be valid Unicode without NUL (got {value!r})")
    return value


def check_run_options(queue: str, priority: int, key: str | None, *, system: bool = False) -> None:
    """A run's queue, priority and idempotency key, as the schema allows them. A queue named
    with ``RESERVED`` is leasekeeper's own (its webhook deliveries): a run of an app never goes
    there (``system``: one of leasekeeper's own runs may), though a worker may serve it."""
    check_queue(queue)
    if not system and queue.startswith(RESERVED):
        raise InvalidPayload(
            f"queue names starting with {RESERVED!r} are leasekeeper's own (got {shown(queue)})"
        )
    low, high = PRIORITY_RANGE
    if not isinstance(priority, int) or isinstance(priority, bool) or not low <= priority <= high:
        raise InvalidPayload(f"priority must be a whole number from {low} to {high}")
    if key is not None:
        check_key(key)


@dataclass(slots=True)
class Encoded:
    """A commit's values as its statements write them (JSON as text), encoded and checked
    before any transaction starts, so a bad value writes nothing (both backends): what a
    kind does not write keeps its default. ``line``..``tokens``: where a next task waits (its gates,
    ``limits.Gating``), set once the task's limits are known."""

    delay: float
    error: str | None
    state: str = "null"
    revision: int = 0
    result: str = "null"
    wait_for: str | None = None
    name: str = ""
    payload: str = "null"
    queue: str | None = None
    version: int | None = None
    reason: str | None = None
    line: str | None = None
    gate_a: str | None = None
    gate_b: str | None = None
    gate_c: str | None = None
    tokens: int | None = None

    def params(self) -> dict[str, Any]:
        """Its fields as named statement parameters (for a kind written on its own)."""
        return {name: getattr(self, name) for name in self.__slots__}

    def place(self, gating: Gating) -> None:
        """The next task waits where ``gating`` says (its line, gates and reservation)."""
        self.line, self.gate_a, self.gate_b, self.gate_c, self.tokens = gating.columns()


_STATEFUL = frozenset(("finish", "advance", "wait", "spawn", "compare_and_set", "migrate"))
_NEXT = frozenset(("advance", "wait", "spawn"))


def commit_params(commit: Commit) -> Encoded:
    """A commit's values (``Encoded``), its JSON encoded and checked before any transaction
    starts, so a bad value writes nothing (both backends)."""
    kind = commit.kind
    out = Encoded(max(0.0, float(commit.delay)), clean_text(commit.error))
    if kind in _STATEFUL:
        out.state = dumps(commit.new_state, "state")
        out.revision = commit.expected_revision
    if kind == "finish":
        out.result = dumps(commit.result, "result")
    elif kind in ("wait", "park"):
        out.wait_for = _text(commit.wait_for, "what the run waits for", MAX_NAME + 7)
    elif kind == "spawn":
        out.wait_for = "children"
    elif kind == "fail":
        out.reason = clean_text(commit.reason or "failed", MAX_NAME)
    if kind in _NEXT:
        out.name = check_name(commit.next_task, "the next task's name")
        out.payload = dumps(commit.next_payload, "payload", MAX_PAYLOAD)
        out.queue = commit.next_queue
        out.version = check_task_version(commit.version)
        if commit.next_queue is not None:  # (only a system run stays on a reserved queue)
            system = commit.lease.queue.startswith(RESERVED)
            check_run_options(commit.next_queue, 0, None, system=system)
    elif kind == "migrate":
        out.version = check_task_version(commit.version)
        if commit.version is None:
            raise InvalidCommit("a migration names the version it moves to")
    return out


@functools.lru_cache(maxsize=256)
def task_options(text: str | None) -> TaskOptions:
    """A task's declared options as the database keeps them (JSON text; None: none declared).
    A value of the wrong kind is left out, never fatal: the pool's own option applies."""
    if not text:
        return NO_OPTIONS
    try:
        found = json.loads(text)
    except ValueError:
        return NO_OPTIONS
    if not isinstance(found, dict):
        return NO_OPTIONS
    kinds = {"max_attempts": int, "retry_backoff": float, "timeout": float, "queue": str,
             "priority": int, "stream_ttl": float}  # fmt: skip
    kept: dict[str, Any] = {}
    for name, kind in kinds.items():
        value = found.get(name)
        if isinstance(value, bool) or value is None:
            continue
        if kind is float and isinstance(value, int):
            value = float(value)
        if isinstance(value, kind):
            kept[name] = value
    limits = found.get("limits")
    if isinstance(limits, list) and all(isinstance(n, str) for n in limits) and limits:
        kept["limits"] = tuple(limits)
    tokens = found.get("tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
        kept["tokens"] = tokens
    return TaskOptions(**kept)
