"""The edges: RabbitMQ (AMQP and the management API), ZooKeeper, TLS, the HTTP health
endpoints, logging and the command-line plumbing. Everything above them decides; these only
carry out."""
