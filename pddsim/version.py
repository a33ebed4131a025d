"""The package's version, bumped when results or the schema change (CHANGELOG.md). A foundation
module of its own so that any layer (the result cache's keys, the CLI) may read it."""
__version__ = "0.5.0"
