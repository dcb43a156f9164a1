"""The ``attnbench`` command: the only package that imports typer and the console."""
