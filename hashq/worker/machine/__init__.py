"""The protocol's decisions, without I/O: state machines that take events and return actions.

The worker runtime and the deterministic simulator (``tools/sim/``) drive the same machines; only
the edges differ (asyncio, aio-pika and kazoo in production; virtual time and server models in
the simulator).
"""
