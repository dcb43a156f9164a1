"""Suites: lra, scaling, lm, vision. Presets are data; the attention is a run-time argument."""
