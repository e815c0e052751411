"""The HTTP layer: the FastAPI app, one router per resource, roles, metrics and health."""
