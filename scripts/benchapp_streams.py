"""The handlers scripts/bench streams measures (``bench_streams.py``):

- ``paced``: emits ``chunks`` chunks ``every`` seconds apart, each carrying the moment it was
  emitted (``time.time()``): a follower in another process subtracts it from the moment it
  read the chunk (emit -> readable);
- ``flood``: emits ``chunks`` short text chunks as fast as it can, then flushes; its result is
  the seconds from its first emit to its flush's return (every chunk written);
- ``steady``: emits ``rate`` chunks a second (or, with ``emit`` false, runs the same loop
  without emitting) until ``until`` no-op runs are done in this process (the pool is
  ``-n 1``), ``seconds`` at most: what the other slots' work is timed beside; its result is
  the wall-clock moment of every ``MARK``-th chunk (the rate it kept, over any window);
- ``noop``: returns at once (the other slots' work), counted.
"""

from __future__ import annotations

import threading
import time

from workerproc import App, TaskContext

app = App()


@app.task
def paced(ctx: TaskContext) -> None:
    chunks, every = int(ctx.payload["chunks"]), float(ctx.payload["every"])
    for i in range(chunks):
        ctx.emit({"i": i, "t": time.time()})
        time.sleep(every)


@app.task
def flood(ctx: TaskContext) -> float:
    chunks = int(ctx.payload["chunks"])
    began = time.perf_counter()
    for i in range(chunks):
        ctx.emit(f"token {i} ")
    ctx.flush()
    return time.perf_counter() - began


MARK = 100  # steady's result: the moment of every MARK-th chunk
NOOPS = [0]  # the no-op runs done in this process
COUNTING = threading.Lock()


@app.task
def steady(ctx: TaskContext) -> list[float]:
    rate, seconds = float(ctx.payload["rate"]), float(ctx.payload["seconds"])
    emit, until = bool(ctx.payload["emit"]), int(ctx.payload.get("until", 0))
    began, marks = time.monotonic(), []
    for i in range(int(rate * seconds)):
        if i % MARK == 0:
            if until and NOOPS[0] >= until:
                break
            marks.append(time.time())
        if emit:
            ctx.emit(f"token {i} ")
        if i % 100 == 99 and (ahead := began + (i + 1) / rate - time.monotonic()) > 0:
            time.sleep(ahead)
    return marks


@app.task
def noop(ctx: TaskContext) -> None:
    with COUNTING:
        NOOPS[0] += 1
