"""The store's conformance suite: every verb of the store's roles (``store/roles.py``), its
normal answer, its fence and its error cases, run against every driver (``conftest.driver``).
A verb without a conformance test fails ``test_meta``."""
