"""Helpers shared by test folders (importable as tests.support)."""
