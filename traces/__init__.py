"""The bundled default trace; it ships inside the package as `pddsim.traces` (see pyproject.toml)."""
