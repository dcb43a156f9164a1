"""Triton kernels and their autograd Functions. A leaf: never imports attnbench."""
