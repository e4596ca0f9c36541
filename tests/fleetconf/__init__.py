"""Tests of the standalone fleet file: parsing, options, reload and deployment."""
