"""Side-by-side benchmark of gdngen's kernels and the peers (FlashInfer, FLA) on one GPU."""
