"""Measurements on a model: quality under compression (KL), error decomposition, failure cases,
eviction inspection."""
