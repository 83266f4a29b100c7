"""Model lifecycle: loading, reloading, retiring and unloading model versions, and the
operations (startup load, explicit control, polling) that drive them off the loop."""
