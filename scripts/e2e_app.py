"""The app scripts/e2e-systemd runs under systemd in its container (installed as e2eapp.py).

Its import waits (at most 120 s) until the file GATE exists, so the check of ``systemctl start``
can hold the supervisor before READY; the reload checks rewrite VERSION (or break the file).
"""

import os
import time

from workerproc import App

VERSION = "v1"
GATE = "/opt/leasekeeper/app/gate"

_deadline = time.monotonic() + 120
while not os.path.exists(GATE) and time.monotonic() < _deadline:
    time.sleep(0.05)

app = App()


@app.task
def step(ctx):
    """Sleep payload["s"] seconds, then advance to the next step or finish the run."""
    payload = ctx.payload or {}
    time.sleep(float(payload.get("s", 0.2)))
    state = dict(ctx.state or {})
    state["steps"] = int(state.get("steps", 0)) + 1
    left = int(payload.get("left", 0))
    if left > 0:
        ctx.advance(state, next="step", payload={**payload, "left": left - 1})
    else:
        ctx.finish(state, result={"version": VERSION, "steps": state["steps"]})


@app.task
def version(ctx):
    return {"version": VERSION}
