"""Fixtures the store's test modules share."""

from once_helpers import book  # noqa: F401 - a fixture: the calls' book of a test's backend
