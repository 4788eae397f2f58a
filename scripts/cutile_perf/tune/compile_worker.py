"""Warm-up of a compile worker, run once in the fork server before it forks any worker.

Importing this module imports cuTile's compiler (which imports torch when it is installed:
cuTile's C extension probes for torch dtypes while building its op tables) and runs cuTile's
cached toolchain probes (``tileiras --version`` and the bytecode-version probe). Every worker
forked afterwards inherits all of it, so none pays an interpreter start, a torch import or a
tileiras probe before its first compile. Under the spawn start method each worker imports it
on its first job instead, which is the old cost and still correct.
"""
from __future__ import annotations


def warm_compiler() -> bool:
    """True when cuTile's compiler is imported and its toolchain probes are cached."""
    try:
        import cuda.tile.compilation  # noqa: F401  (the KernelSignature types the jobs carry)
        from cuda.tile._cext import default_tile_context, dev_features_enabled
        from cuda.tile._compile import _get_compiler_version_string, _get_max_supported_bytecode_version

        _get_compiler_version_string()
        _get_max_supported_bytecode_version(default_tile_context.config.temp_dir, allow_dev=dev_features_enabled())
    except Exception:  # a private API moved or tileiras is missing: the first compile pays (or reports) it
        return False
    return True


WARM = warm_compiler()
