"""Evaluation: label-token scoring, metrics, sweeps, routing, the holdout ledger."""
