"""Fuzz targets over the parsers of untrusted input (issue 20 item 18): property tests (hypothesis,
tests/unit/test_fuzz_properties.py) and coverage-guided runs (atheris, `nox -s fuzz`) share them."""
