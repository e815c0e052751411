"""SARA package."""
