"""Check specs, one module per notebook; each exposes ``SPECS``."""
