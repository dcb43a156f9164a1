"""Suites: lra, scaling, vision, adala, mixa, lm, claims. Presets are data; the attention is a run-time argument."""
