"""Measurements: error decomposition (note §15) and quality under compression."""
