"""knobs.py: environment values we reject are usage errors (exit 2), still catchable as ValueError."""
import pytest

from cutile_perf import knobs
from cutile_perf.errors import EXIT_USAGE, CutilePerfError


@pytest.mark.parametrize("name, read", [("CUTILE_PERF_BENCH_MODE", knobs.bench_mode),
                                        ("DISABLE_AUTOTUNE", knobs.autotune_disabled)])
def test_bad_env_value_is_a_usage_error_not_an_unexpected_crash(monkeypatch, name, read):
    # Was a bare ValueError: the CLI reported a typo in an env var as "a bug in cutile-perf" (exit 70).
    monkeypatch.setenv(name, "typo")
    with pytest.raises(ValueError, match=f"{name}='typo'") as caught:
        read()
    assert isinstance(caught.value, CutilePerfError) and caught.value.exit_code == EXIT_USAGE
