"""Command-line interface (nothing else imports this package)."""
