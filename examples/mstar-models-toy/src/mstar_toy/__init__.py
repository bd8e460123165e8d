"""The ``toy`` model: an example M* plugin."""
