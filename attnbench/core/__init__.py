"""The foundation every layer stands on: the errors attnbench raises and the validation of q, k, v (torch-free errors)."""
