"""The worker runtime: ``hashq-worker`` and ``hashq.Worker``.

``machine/`` decides (events in, actions out, no I/O); ``runtime`` carries its actions out on
RabbitMQ and ZooKeeper; ``session`` keeps the worker's ZooKeeper membership; ``bucket`` holds one
granted bucket's channel; ``lanes``, ``runners``, ``acks``, ``retry`` and ``dead_letter`` run
and settle its jobs."""
