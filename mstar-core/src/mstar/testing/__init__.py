"""Test helpers for M* and its plugins: the conformance kit (``mstar.testing.conformance``)."""
