"""The dashboard (``supervisor web``): server-rendered pages over the store, in a process of
their own. Needs the ``web`` extra (starlette, jinja2, uvicorn)."""
