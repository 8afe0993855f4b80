"""Benchmarks, scenario replays, the fault harness and the invariant checker.

Everything here measures or attacks Phalanx; nothing in the product imports it (an
import-linter layer keeps it that way): ``core_replay`` replays Kueue's scheduler scenarios
through the pure core in virtual time, ``placement*`` compares placers, ``e2e`` and its
helpers replay a scenario through a real API server with a running operator, and
``invariants`` watches the API for overshoot, double admission and leaks.
"""
