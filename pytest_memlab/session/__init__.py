"""The session: results, environment, the baseline's finish, reports, and
pytest-xdist's worker and controller sides; GPU pinning for workers."""
