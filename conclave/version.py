"""The release of conclave, in one place the package and every module read it from."""

__version__ = "0.1.0"
