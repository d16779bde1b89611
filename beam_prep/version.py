"""Single source of the package version (read by setup.py as text)."""

__version__ = "0.1.0"
