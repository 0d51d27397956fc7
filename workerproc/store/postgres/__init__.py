"""The PostgreSQL backend (the ``postgres`` extra installs its driver): ``sql`` and ``reads_sql``
hold its statements, ``steps`` its catalogue, ``schema`` its tables and migrations, ``dialect``
its connections and transactions, ``admin`` migrations, amcheck and the caller's-connection
check, ``listen`` the LISTEN connection."""
