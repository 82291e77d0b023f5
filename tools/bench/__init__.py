"""The benchmarks (`make bench`): hashq against the raw broker on the same machine, in one run."""
