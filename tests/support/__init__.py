"""Helpers the tests share."""
