"""Everything that runs or reads a pytest child: processes, pristine checkouts, stages, records."""
