"""The ``supervisor`` command line: ``start`` (the pool) and the operator commands, with their
rendering. Everything users can get wrong turns into one line on stderr and an exit code."""
