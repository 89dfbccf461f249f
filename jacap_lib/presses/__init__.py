"""kvpress presses of the book, one press per file (kvpress layout), and the method registry."""
