"""Measuring a test: its measurement (the ``memlab`` fixture), one run of
its protocol, and the leak protocol's search for leaked tensors and their
holders."""
