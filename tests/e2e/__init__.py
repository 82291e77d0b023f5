"""Whole runs: the demo, the chaos run, the benchmarks, the three-node cluster."""
