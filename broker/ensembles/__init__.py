"""Ensembles inside the broker: the plan of steps, one run per request, and how requests
reach an ensemble or a plain model."""
