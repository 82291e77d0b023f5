"""Fencing: cutting a worker incarnation off RabbitMQ, so that its buckets can move on at a
higher epoch. Three parts, each in its own module:

- ``fencer.Fencer``: the leader's fences under way, carried out one per incarnation, and
  whether this coordinator can fence at all (readiness, metrics);
- ``cutoff``: closing the incarnation's connections through the management API, once the
  newest announced one can be listed;
- ``liveness``: asking the broker itself, with no listing lag, whether the incarnation still
  holds a connection.

What each fence covered is bookkeeping without I/O, kept with the decisions
(``hashq_coordinator.machine.fencebook``).
"""
