"""What every generated call runs on: input checks, dispatch, the compile cache and the launch."""
