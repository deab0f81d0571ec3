"""Measured dispatch: `gdngen tune` times the candidate variants of every dispatch cell on a GPU
and writes a tuning file next to the spec; `gdngen emit` turns it into dispatch rows."""
