"""The ``ember`` command line."""
