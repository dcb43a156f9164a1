"""The public API: the registries of mechanisms and suites, specs and plug-ins.

Importing the package installs the plug-in loader as the registry's look-up hook (:mod:`.plugins`).
"""

from attnbench.api import plugins  # noqa: F401
