"""`tritond analyze`: sweeps a model's config in a running tritond and reports the best one."""
