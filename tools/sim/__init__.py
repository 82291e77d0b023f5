"""A deterministic simulation of hashq: the production state machines on virtual time, with
models of RabbitMQ and ZooKeeper and faults drawn from a seed (``make sim``; docs/guarantees.md).
Tooling: not shipped in the runtime packages."""
