"""What the operator's two faces share: the command line (``supervisor.commands``) and the
dashboard (``supervisor.web``) both import these, and neither imports the other.

- ``actions``: what an operator does to the store, free of click and of HTTP (open it, enqueue,
  retry, cancel, resolve a paid call, prune) and the rows both show of the workers.
- ``render``: plain text for people (tables, plurals, times, run status phrases), JSON for scripts.
"""
