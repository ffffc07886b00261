"""What fails a test: the verdicts (budgets, leaks, the baseline), the
findings they record, their words, and the baseline file."""
