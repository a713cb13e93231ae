"""labelrl."""
