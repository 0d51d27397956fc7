"""The supervisor's main loop and what it drives: the arbiter and its steps, the worker pool,
signals, forking, the pidfile and the short-lived database sessions of the parent."""
