"""The bundled scenarios; they ship inside the package as `pddsim.configs` (see pyproject.toml)."""
