"""A follower process for tests/chaos/test_streams_chaos.py: follows every run named on its
command line live (``AsyncStore.follow_stream``, all at once, from offset 0) until each is
over, and writes each chunk it received as one JSON line, as it receives it.

    python stream_follower.py DB OUT RUN [RUN ...]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from workerproc.store import open_async_store


async def follow(db: str, out: str, runs: list[int]) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    store = await open_async_store(db)
    try:

        async def one(run_id: int) -> None:
            async for chunk in store.follow_stream(run_id, poll=0.5):
                line = json.dumps({"run": run_id, **chunk.as_json()}) + "\n"
                os.write(fd, line.encode())

        await asyncio.gather(*(one(r) for r in runs))
        os.write(fd, (json.dumps({"done": True}) + "\n").encode())
    finally:
        await store.close()
        os.close(fd)


if __name__ == "__main__":
    asyncio.run(follow(sys.argv[1], sys.argv[2], [int(r) for r in sys.argv[3:]]))
