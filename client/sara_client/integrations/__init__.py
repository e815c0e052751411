"""Adapters that put SARA's allocation into other training libraries (optional dependencies)."""
