"""Triton kernels and the Triton TileIR backend: check the install, classify kernels, add gated
TileIR configs, verify kernels against a torch reference.

Nothing here needs the TileIR backend to be installed: every probe degrades to "not available".
"""
