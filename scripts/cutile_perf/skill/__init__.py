"""The shipped skill: where its files live, the docs check, and the playbook as data."""
