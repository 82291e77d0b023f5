"""The ``hashq`` admin command: init, publish, status, dead-letters, zk-digest."""
