"""The ``mstar`` command line (``mstar.cli.main:main``)."""
