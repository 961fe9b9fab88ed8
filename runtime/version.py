"""The package version: the single source, read by pyproject (regex provider) and the manifest check."""

__version__ = "0.1.0"
