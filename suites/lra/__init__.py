"""Long Range Arena: readers for the released file formats (``data``) and synthetic generators (``generate``).

Import as ``attnbench.suites.lra.data`` / ``attnbench.suites.lra.generate``.
"""
