"""Chaos mode: faults injected into our own workers (``faults``) and the judge that believes only
the database (``verifier``)."""

from __future__ import annotations

from .faults import Chaos

__all__ = ["Chaos"]
