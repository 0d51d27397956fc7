"""The handlers scripts/bench batch measures: an embeddings-shaped no-op batch step, declared at
batch=64 and at batch=1 (the same handler): each call turns its items' texts into vectors at
once (no provider) and finishes each item with its own."""

from __future__ import annotations

from workerproc import App, Batch

app = App()


def embed(batch: Batch) -> None:
    vectors = [[len(ctx.payload["text"]), 1.0] for ctx in batch]
    for ctx, vector in zip(batch, vectors, strict=True):
        ctx.finish({"vector": vector})


app.task("embed_64", batch=64, batch_wait=0.5)(embed)
app.task("embed_1", batch=1, batch_wait=0)(embed)
