"""Reading and compiling kernels without running the loop: scan, compile-check, scaffold, survey, target timing."""
