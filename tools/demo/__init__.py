"""The live demo of ``make run``: an example handler (per-user video processing), run by two
coordinators and three workers, then checked."""
