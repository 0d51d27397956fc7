"""Fixtures the worker's test modules share."""

from collections.abc import Iterator

import pytest
from webhook_receiver import SECRET, Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A local HTTP receiver checking every POST's signature with ``SECRET`` (a module with
    another secret defines its own)."""
    r = Receiver(SECRET)
    yield r
    r.down()
