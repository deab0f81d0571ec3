"""Kernels emitted by gdngen, one package per target (see specs/)."""
