"""The chaos app on a store whose fencing is deliberately broken (``tests/support/unfenced.py``).

The supervisor imports its app before it forks, so importing this module breaks the fence in the
supervisor and in every worker it starts. Only the verifier's must-fail test uses it.
"""

from __future__ import annotations

from unfenced import disable_fencing

from apps.chaos_app import app

disable_fencing()

__all__ = ["app"]
