"""The SQLite backend: one database file in WAL mode. ``sql`` and ``reads_sql`` hold its
statements, ``steps`` its catalogue (the completions' steps in ``completions``), ``schema`` its
tables and migrations, ``dialect`` its connections and transactions, ``intent`` the producers'
priority hint."""
