"""Correctness: the one tolerance policy, verification of fast forms, the registry's contract, AOT compiles."""
