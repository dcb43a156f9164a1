"""Readers of data file formats shared by several suites and the engine (safe unpickling, CIFAR batches)."""
