"""Tests against real RabbitMQ and ZooKeeper, started by tools/services.sh."""
