"""The coordinator's decisions, without I/O: ``core.CoordinatorMachine`` takes ``events`` and
returns actions; ``planner`` (who should own each bucket), ``handover`` (each bucket's next
record) and ``fencebook`` (which connection each fence covered) are pure functions and data it
uses. ``hashq_coordinator.runtime`` and the simulator (``tools/sim/``) drive the same machine."""
