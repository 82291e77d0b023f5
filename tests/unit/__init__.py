"""Tests that need no server: the pure cores, the checker, the simulator."""
