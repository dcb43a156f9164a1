"""Running suites: the run context, the cell sweep, presets, smoke runs, the trainer and distribution."""
