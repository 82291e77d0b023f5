"""The worker runtime: ``hashq-worker`` and ``hashq.Worker``.

- ``machine/``: the decisions, without I/O (events in, actions out): which buckets to consume,
  when to drain, release, reconnect, register again or withdraw; a lease's deliveries in queue
  order, one job per key at a time (``lanes``);
- ``runtime``: the loop that feeds the machine and carries its actions out on RabbitMQ and
  ZooKeeper; ``session``: the worker's ZooKeeper membership;
- ``bucket_lease``: one granted bucket's channel (``BucketLease``); ``jobs``: one delivery's life,
  from delivery to acknowledgement, retry or dead letter; ``runners``: the pool that runs
  handlers; ``acks``, ``retry``, ``dead_letter``: what ``jobs`` settles with;
- ``starvation``: buckets consumed that their queue does not feed, told in readiness;
- ``metrics``, ``cli``.
"""
