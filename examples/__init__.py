"""Examples: a handler, the live demo (`make run`) and the checker of what handlers recorded."""
