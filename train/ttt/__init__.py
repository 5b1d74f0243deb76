"""Training-time test: the EAGLE-3 unroll as a plain function."""
