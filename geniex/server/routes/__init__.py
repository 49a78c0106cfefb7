"""Blueprints, one per API area."""
