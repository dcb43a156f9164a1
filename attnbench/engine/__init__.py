"""Running suites: the run context, the cell sweep, presets, smoke runs, the trainer and distribution; and the
wheel bundle that installs attnbench on a machine with no network."""
