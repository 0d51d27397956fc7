"""The seeded simulator (``scripts/simulate``): the real store and the worker's real decision
code under a virtual clock, a seeded scheduler and faults, judged by invariants after every
step (docs/protocol.md, Invariants; docs/explanation/testing.md)."""
