"""Research workflow: a run's record read back (runs), and the tables and charts of a
run or of a sweep of runs (report). `launch.ablate` runs sweeps; `launch.report`
draws one run."""
