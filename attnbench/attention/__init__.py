"""One file per mechanism, each the paper's math with its equation numbers; registered by name in
:data:`attnbench.api.registry.BUILTIN_ATTENTIONS` and imported on first use."""
