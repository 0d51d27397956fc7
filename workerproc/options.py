"""Options declared once: each config field carries its flag, help, range and README text.

A config is a dataclass whose fields are made with ``opt(...)``. From that one declaration come
the command-line options (click in the supervisor, argparse in ``python -m workerproc``), the
environment variables (``SUPERVISOR_<FLAG>``), the checks ``validate`` runs, and the README's
option tables. Nothing else restates a flag, a default or a range.

Every number has a range: finite, with a minimum and a maximum, so ``inf``, ``nan`` or ``1e309``
never reach the code that would sleep, loop or allocate on them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

ENV_PREFIX = "SUPERVISOR_"
DAY = 86_400.0  # seconds: the ranges of the options that take a duration
_MISSING: Any = dataclasses.MISSING
T = TypeVar("T")


@dataclass(frozen=True)
class Opt:
    """How one config field appears to users."""

    flag: str  # "--lease-ttl" (or "--fast-release/--no-fast-release" for an on/off flag)
    help: str
    metavar: str | None = None
    short: str | None = None  # "-n"
    low: float | None = None  # the smallest value allowed
    high: float | None = None  # the largest value allowed
    above: bool = False  # ``low`` itself is not allowed (a value must be greater)
    choices: tuple[str, ...] | None = None  # for strings, and for each item of a list
    shown_default: str | None = None  # README/help text when the default says too little
    meaning: str | None = None  # the README's sentence, when it says more than ``help``
    on_supervisor: bool = True  # an option of ``supervisor start``
    on_worker: bool = True  # an option of ``python -m workerproc``
    envvar: str | None = None  # the environment variable, when not ``SUPERVISOR_<NAME>``
    secret: bool = False  # taken exactly as given (never stripped, never "none")
    multiple: bool = False  # a list option that may be given more than once (values add up)

    @property
    def long(self) -> str:
        return self.flag.split("/")[0]

    @property
    def name(self) -> str:
        """The parameter name: ``--lease-ttl`` -> ``lease_ttl``."""
        return self.long.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return self.envvar or ENV_PREFIX + self.name.upper()

    @property
    def label(self) -> str:
        return f"{self.short}/{self.long}" if self.short else self.long

    def bounds(self) -> str:
        low = "" if self.low is None else f"{'>' if self.above else '>='} {show_number(self.low)}"
        high = "" if self.high is None else f"<= {show_number(self.high)}"
        return " and ".join(x for x in (low, high) if x)


def opt(default: Any = _MISSING, **kwargs: Any) -> Any:
    """A dataclass field declared as a user-facing option (see ``Opt``)."""
    return dataclasses.field(default=default, metadata={"opt": Opt(**kwargs)})


@dataclass(frozen=True)
class Declared:
    """One declared field of a config class, with its resolved type."""

    field: str  # the attribute name in the config class
    opt: Opt
    kind: type  # int, float, str, bool or tuple (a comma-separated list of str)
    optional: bool  # None is a valid value (no limit, off)
    default: Any
    required: bool


def declared(cls: type) -> Iterator[Declared]:
    """The declared options of a config class, in field order (nested configs not included)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        o = f.metadata.get("opt")
        if o is None:
            continue
        kind, optional = _kind(hints[f.name])
        default = None if f.default is dataclasses.MISSING else f.default
        yield Declared(f.name, o, kind, optional, default, f.default is dataclasses.MISSING)


def _kind(hint: Any) -> tuple[type, bool]:
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional:
        (hint,) = (a for a in args if a is not type(None))
    origin = typing.get_origin(hint)
    if origin is tuple:
        return tuple, optional
    if hint not in (int, float, str, bool):
        raise TypeError(f"unsupported option type {hint!r}")
    return hint, optional


def check(d: Declared, value: Any) -> str | None:
    """Why ``value`` is not allowed for ``d`` (a message naming the flag), or None."""
    o = d.opt
    if value is None:
        return None if d.optional else f"{o.label} is required"
    if d.kind in (int, float) and not isinstance(value, bool):
        number = float(value)
        if not math.isfinite(number):
            return f"{o.label} must be a finite number (got {value!r})"
        too_low = o.low is not None and (number <= o.low if o.above else number < o.low)
        too_high = o.high is not None and number > o.high
        if too_low or too_high:
            return f"{o.label} must be {o.bounds()} (got {number:g})"
    if o.choices is not None:
        items = value if isinstance(value, tuple) else (value,)
        bad = [v for v in items if v not in o.choices]
        if bad or not items:
            got = ",".join(bad) if bad else "nothing"
            return f"{o.label} must be {_either(o.choices, d.kind is tuple)} (got {got})"
    if d.kind is str and not str(value).strip() and d.required:
        return f"{o.label} must not be empty"
    return None


def validate(config: object) -> None:
    """Check every declared field of ``config`` (not of the configs it holds: each validates
    its own); ValueError names the first flag whose value is not allowed."""
    for d in declared(type(config)):
        message = check(d, getattr(config, d.field))
        if message is not None:
            raise ValueError(message)


def build(cls: type[T], values: Mapping[str, Any], **extra: Any) -> T:
    """An instance of config class ``cls`` from parameter values keyed by option name
    (``lease_ttl``, ``chaos`` …); options missing from ``values`` keep their defaults."""
    kwargs = {d.field: values[d.opt.name] for d in declared(cls) if d.opt.name in values}
    return cls(**kwargs, **extra)


def parse(d: Declared, text: str) -> Any:
    """A value of ``d``'s type from a command-line or environment string; ValueError if not."""
    if d.opt.secret:
        return text  # a token of spaces is refused by its check, never read as "no token"
    text = text.strip()
    if d.optional and text.lower() in ("", "none"):
        return None
    if d.kind is bool:
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{d.opt.label}: {text!r} is not a boolean")
    if d.kind is tuple:
        return tuple(item.strip() for item in text.split(",") if item.strip())
    if d.kind is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{d.opt.label}: {text!r} is not a whole number") from None
    if d.kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{d.opt.label}: {text!r} is not a number") from None
    return text


def shown_default(d: Declared) -> str:
    """The default as the README and ``--help`` show it."""
    if d.opt.shown_default is not None:
        return d.opt.shown_default
    if d.required:
        return "required"
    if d.default is None:
        return "none"
    if d.kind is bool:
        return "on" if d.default else "off"
    if d.kind is tuple:
        return ",".join(d.default)
    return show_number(d.default) if isinstance(d.default, (int, float)) else str(d.default)


def show_number(value: float) -> str:
    """A number as a reader writes it: 30, 0.1, 65535, 31,536,000 (never 3.1536e+07)."""
    if isinstance(value, float) and not (value.is_integer() and abs(value) < 1e21):
        return f"{value:g}"
    return f"{int(value):,}" if abs(value) >= 100_000 else str(int(value))


def _either(choices: tuple[str, ...], many: bool) -> str:
    listed = ", ".join(choices)
    return f"a comma-separated list of {listed}" if many else f"one of {listed}"


def _printable(text: str) -> str:
    """``text`` with the bytes that are not UTF-8 shown as ``\\xff``."""
    try:
        return os.fsencode(text).decode("utf-8", "backslashreplace")
    except UnicodeError:
        return text.encode("utf-8", "backslashreplace").decode()


def not_utf8(args: Sequence[str]) -> str | None:
    """Why the command line or a ``SUPERVISOR_*`` variable cannot be taken, or None. Python
    keeps bytes that are not UTF-8 as lone surrogates, which no database, log or terminal
    takes; every name, key, payload and path goes to one of them."""
    for i, arg in enumerate(args, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            return f"argument {i} ('{_printable(arg)}') is not valid UTF-8"
    for name, value in os.environ.items():
        if name.startswith(ENV_PREFIX):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"{_printable(name)} ('{_printable(value)}') is not valid UTF-8"
    return None
