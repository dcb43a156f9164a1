"""Claims: each paper's mechanism-level argument measured on attnbench's implementations, with a verdict (work in progress)."""
