"""Handlers that log through the standard library (tests/supervisor/test_handler_logging.py)."""

from __future__ import annotations

import asyncio
import logging
import time

from workerproc import App, TaskContext

app = App()
log = logging.getLogger(__name__)


@app.task
def talk(ctx: TaskContext) -> None:
    log.debug("debug from run %s", ctx.run_id)
    log.info("info from run %s", ctx.run_id)
    time.sleep(0.05)  # another slot logs meanwhile: each record keeps its own task
    log.warning("warning from run %s", ctx.run_id)


@app.task
async def talk_async(ctx: TaskContext) -> None:
    log.info("async info from run %s", ctx.run_id)
    await asyncio.sleep(0.05)
    log.warning("async warning from run %s", ctx.run_id)
